"""What one component writes and another reads, one class each: the trainer's phase, the
learner's step stats, an iteration's record (metrics.jsonl, /status), the trainer's /status
body, the run summary (summary.json, the trainer's alone), a local run's record (run.json,
`streamrl run`'s alone) and an autoscaler round (autoscaling.jsonl). Readers parse through
these classes, so a renamed field fails where it is read, not silently downstream.
Imports neither torch nor grpc.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Self

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from streamrl.scaling.policy import Decision, Observation

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
LOCAL_RUN_FILE = "run.json"
SCALING_FILE = "autoscaling.jsonl"
EVENTS_FILE = "events.jsonl"


class TrainerPhase(StrEnum):
    """Where a trainer is in its run (its /status, summary.json and `streamrl_phase`)."""

    LOADING = "Loading"
    """Loading the model onto its device (its admin server already answers; not ready)."""
    RESUMING = "Resuming"
    """Loading the newest checkpoint of its run (its /status `iteration` is the checkpoint's)."""
    STARTING = "Starting"
    WAITING_FOR_GENERATORS = "WaitingForGenerators"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INTERRUPTED = "Interrupted"
    PREEMPTED = "Preempted"
    """SIGTERM: the current step finished, a checkpoint saved, exit 0; the next start resumes."""

    @property
    def is_terminal(self) -> bool:
        return self in (TrainerPhase.SUCCEEDED, TrainerPhase.FAILED, TrainerPhase.INTERRUPTED,
                        TrainerPhase.PREEMPTED)


@dataclass(frozen=True)
class StepStats:
    """What one optimizer step of the learner did (sums over its micro-batches)."""

    num_samples: int
    num_micro_batches: int
    loss: float
    """Sum of the micro-batches' losses (each already weighted by its share of the step)."""
    clip_fraction: float
    """Sample-weighted mean fraction of completion tokens whose ratio was clipped."""
    kl: float
    """Sample-weighted mean k3 KL to the reference policy (0 without one)."""
    grad_norm: float
    """Total gradient norm before clipping."""
    forward_backward_s: float
    optimizer_s: float
    value_loss: float = 0.0
    """ppo: sum of the micro-batches' critic losses (0 under grpo)."""
    mismatch_abs_logp: float = 0.0
    """Train/inference mismatch: mean over completion tokens of |log p_learner - log p_engine|."""
    mismatch_kl: float = 0.0
    """Mean over completion tokens of the k3 estimate of KL(engine || learner)."""
    mismatch_ratio_max: float = 1.0
    """The largest probability ratio of one sampled token between learner and engine, either way."""
    importance_capped_fraction: float = 0.0
    """Fraction of completion tokens whose importance weight was truncated or masked (algorithm.importanceSampling)."""

    @property
    def train_s(self) -> float:
        return self.forward_backward_s + self.optimizer_s


class Record(BaseModel):
    """A typed JSON record: frozen; unknown keys ignored (a newer writer may add some), a
    missing required one is an error naming it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def read(cls, path: Path) -> Self:
        """Parse one JSON file; ValueError naming the file and the field."""
        try:
            return cls.model_validate_json(Path(path).read_text())
        except ValueError as err:
            raise ValueError(f"{path}: not a {cls.__name__}: {err}") from None

    @classmethod
    def read_lines(cls, path: Path, skip_partial_last: bool = True) -> list[Self]:
        """Parse a JSONL file; a process killed mid-write leaves a partial last line, skipped."""
        lines = Path(path).read_text().splitlines()
        out = []
        for lineno, line in enumerate(lines, 1):
            try:
                out.append(cls.model_validate_json(line))
            except ValueError as err:
                if skip_partial_last and lineno == len(lines) and not line.endswith("}"):
                    break
                raise ValueError(f"{path}:{lineno}: not a {cls.__name__}: {err}") from None
        return out


class IterationRecord(Record):
    """One training iteration, as metrics.jsonl and the trainer's /status report it."""

    iteration: int
    policy_version: int
    """The learner's version after this iteration's optimizer step."""
    reward_mean: float
    num_samples: int
    samples_per_s: float
    pipeline_bubble_ratio: float
    """Trainer seconds idle waiting for samples / wall seconds of the iteration."""
    skewness_bubble_ratio: float
    wall_s: float
    generation_s: float
    """Seconds from the iteration's start until its last sample arrived."""
    train_s: float
    """Forward/backward plus optimizer seconds."""
    completion_tokens_mean: float
    completion_tokens_max: int
    loss: float
    clip_fraction: float
    kl: float
    grad_norm: float
    value_loss: float = 0.0
    """ppo: the critic's loss over the iteration's samples (0 under grpo)."""
    mismatch_abs_logp: float = 0.0
    """Train/inference mismatch: mean over completion tokens of |log p_learner - log p_engine|
    (the learner's log-probability before the step against the one the engine reported; it
    includes the policy's change for samples of an older version)."""
    mismatch_kl: float = 0.0
    """Mean over completion tokens of the k3 estimate of KL(engine || learner)."""
    mismatch_ratio_max: float = 1.0
    """The largest probability ratio of one sampled token between learner and engine, either way."""
    importance_capped_fraction: float = 0.0
    """Fraction of completion tokens whose importance weight was truncated or masked at
    algorithm.importanceSampling.cap (0 without a correction)."""
    num_micro_batches: int
    staleness_mean: float
    staleness_max: int
    """Versions behind the learner that consumed them, counted from each sample's oldest token."""
    num_samples_mixed_versions: int = 0
    """Samples whose tokens came from more than one weight version (pipeline.inFlightUpdates)."""
    versions_per_sample_mean: float = 1.0
    """Weight versions that generated a sample's tokens, mean over the iteration's samples."""
    num_samples_stale_dropped: int
    """Run total so far."""
    weight_sync_s_max: float
    """Slowest replica's seconds from notice to swap of the version this iteration started from."""
    weight_bytes_from_trainer: int
    weight_bytes_from_peers: int
    elapsed_s: float
    """Seconds since the trainer started."""
    time_unix: float
    """When the iteration ended."""
    predicted_length_mean: float | None = None
    """With predicted lengths (ranked dispatch): the prompts' mean predicted output length."""
    actual_length_mean: float | None = None
    long_tail_actual_length_mean: float | None = None
    regular_actual_length_mean: float | None = None


class GeneratorStatus(Record):
    """A connected replica, as the trainer sees it."""

    pool: str
    capacity: int
    outstanding: int
    """Samples assigned to it and not yet received."""
    policy_version: int
    num_samples: int
    """Samples accepted from it."""
    tokens_per_s: float | None = None
    """From its latest load report (None before the first)."""
    weights_address: str = ""
    latency_profile: list[tuple[int, float]] = []
    """PTL(BS): (batch size, seconds per decode step)."""
    join_s: float | None = None
    """Process start to its first accepted sample (None: not yet, or its start is unknown)."""


class GeneratorJoin(Record):
    """How long a replica took to join: from its process's start (interpreter, imports, model
    load, start-up profiling, connecting) to its first sample the trainer accepted."""

    generator_id: str
    pool: str
    startup_s: float
    """Process start to its Hello."""
    join_s: float
    """Process start to its first accepted sample."""


class CheckpointInfo(Record):
    """A checkpoint written whole (its manifest on disk)."""

    iteration: int
    """Iterations trained before it: a resume continues with this iteration."""
    time_unix: float
    path: str


class TrainerStatus(Record):
    """The trainer's /status body (read by `streamrl run` and the operator)."""

    run_id: str
    phase: TrainerPhase
    mode: str
    iteration: int
    """Iterations finished."""
    num_iterations: int
    policy_version: int
    num_samples_accepted: int
    samples_per_s: float
    """Samples over the iterations' wall seconds so far."""
    uptime_s: float
    last: IterationRecord | None = None
    generators: dict[str, GeneratorStatus] = {}
    generator_joins: list[GeneratorJoin] = []
    """Every replica whose first sample this start of the trainer accepted, in order (departed
    ones included): `streamrl run` tells a replica that served from one that died before."""
    num_prompts_inflight: int = 0
    num_samples_pending: int = 0
    num_groups_ready: int = 0
    incarnation: int = 0
    """Starts of this run's trainer so far, minus one (0: never restarted)."""
    resumed_from: int | None = None
    """The iteration this start resumed at (None: started fresh)."""
    last_checkpoint: CheckpointInfo | None = None

    def doing(self) -> str:
        """What a trainer that is not running yet is doing, in words (the operator's Pending
        message, a local run's progress line)."""
        if self.phase == TrainerPhase.LOADING:
            return "trainer loading the model"
        if self.phase == TrainerPhase.RESUMING:
            return f"trainer resuming from iteration {self.iteration}"
        return self.phase.value


class RunSummary(Record):
    """summary.json: the trainer's account of its run, written once on its way out."""

    phase: TrainerPhase
    mode: str
    num_iterations: int
    num_samples: int
    wall_s: float
    """Seconds from the trainer's start to its summary."""
    train_wall_s: float
    """Sum of the iterations' wall seconds."""
    samples_per_s: float
    reward_mean: float
    """Sample-weighted over the run."""
    pipeline_bubble_ratio: float
    """Wall-weighted over the iterations."""
    skewness_bubble_ratio: float
    policy_version: int
    num_prompts_dispatched: int
    num_samples_accepted: int
    num_samples_duplicate_dropped: int
    num_samples_redispatched: int
    num_samples_rejected: int
    num_samples_stale_dropped: int
    num_samples_reward_failed: int = 0
    """Samples whose reward function raised (reward.onError: zero scores them 0)."""
    num_samples_previous_incarnation: int = 0
    """Samples of work an earlier start of the trainer handed out, dropped after a resume."""
    num_samples_refused: dict[str, int] = {}
    """Samples and Connect messages the trainer refused, by reason (docs/observability.md
    lists the reasons); the duplicate, stale, rejected and previous-incarnation counts are parts of it."""
    weight_bytes_from_trainer: int
    weight_bytes_from_peers: int
    reward_first: float | None = None
    reward_last: float | None = None
    generator_joins: list[GeneratorJoin] = []
    """Every replica that joined during the run, in order."""
    incarnation: int = 0
    """Starts of the trainer over the run, minus one (resumes from checkpoints)."""
    resumed_from: int | None = None
    """The iteration the last start resumed at (None: it started fresh)."""
    last_checkpoint: CheckpointInfo | None = None
    checkpoint_wait_s: float = 0.0
    """Seconds this start of the trainer waited on checkpoints (copying state off the model, a
    previous save still being written); the rest of every save overlapped training."""

    @classmethod
    def of(cls, records: list[IterationRecord], **totals) -> RunSummary:
        """Totals and wall-weighted means over the iterations, plus the trainer's counters."""
        num_samples = sum(r.num_samples for r in records)
        wall = sum(r.wall_s for r in records)

        def weighted(key: str) -> float:
            return sum(getattr(r, key) * r.wall_s for r in records) / wall if wall else 0.0

        return cls(
            num_iterations=len(records), num_samples=num_samples, train_wall_s=round(wall, 3),
            samples_per_s=num_samples / wall if wall else 0.0,
            reward_mean=sum(r.reward_mean * r.num_samples for r in records) / num_samples if num_samples else 0.0,
            pipeline_bubble_ratio=weighted("pipeline_bubble_ratio"),
            skewness_bubble_ratio=weighted("skewness_bubble_ratio"),
            policy_version=records[-1].policy_version if records else 0,
            reward_first=records[0].reward_mean if records else None,
            reward_last=records[-1].reward_mean if records else None,
            **totals,
        )


class ScalingRecord(Record):
    """One local autoscaler round (a line of autoscaling.jsonl): a decision, or why none."""

    time_unix: float
    step: int
    """+1, 0 or -1."""
    replicas: dict[str, int]
    """Replicas per pool after the round."""
    reason: str
    pool: str | None = None
    trainer_bound: bool = False
    generation_s: float | None = None
    train_s: float | None = None
    idle_no_work: float | None = None
    window_s: float | None = None

    @classmethod
    def of(cls, decision: Decision, observation: Observation, window_s: float, now: float) -> ScalingRecord:
        """A round that decided: the decision, what it observed over `window_s` seconds, at `now`
        (rounded as autoscaling.jsonl holds them)."""
        return cls(time_unix=round(now, 3), step=decision.step, pool=decision.pool, replicas=decision.replicas,
                   reason=decision.reason, trainer_bound=decision.trainer_bound,
                   generation_s=round(observation.generation_s, 4), train_s=round(observation.train_s, 4),
                   idle_no_work=round(observation.idle_no_work, 4), window_s=round(window_s, 1))


class ScalingSummary(Record):
    """What a local autoscaler did over a run."""

    mode: str
    scale_ups: int
    scale_downs: int
    replicas_final: dict[str, int]
    last: ScalingRecord | None = None


class LocalRun(Record):
    """run.json: what only `streamrl run` knows of a run (the processes it ran)."""

    generator_replica_seconds: float
    """Every generator replica's life, start to exit, summed."""
    generator_replicas_started: int
    trainer_exit_code: int | None = None
    """The last start's rank 0 exit code."""
    trainer_restarts: int = 0
    """Times the runner restarted the trainer (its whole group) after it failed."""
    autoscaling: ScalingSummary | None = None
    failure: str | None = None
    """Why `streamrl run` failed the run itself (e.g. Prometheus scraping nothing); None: it did not."""


class RunEvent(Record):
    """A line of events.jsonl: something that happened to a process of the run, for the
    report's timeline and its table of events. Written by whoever saw it: `streamrl run`
    (died, backoff, restarted, replaced, scaled), the trainer (resumed, checkpoint, preempted)."""

    time_unix: float
    kind: str
    """died | backoff | restarted | replaced | resumed | checkpoint | preempted | scaled (backoff: a
    replica died before it served; its replacement waits, the detail says how long)"""
    process: str
    """The process it happened to (its timeline's name: trainer, trainer-rank-1, gen-default-0...)."""
    detail: str = ""


def append_event(out_dir: Path, event: RunEvent) -> None:
    """One line onto <out_dir>/events.jsonl, flushed (a reader sees whole lines; a writer
    killed mid-line leaves a partial last line that read_lines skips)."""
    with open(Path(out_dir) / EVENTS_FILE, "a") as f:
        f.write(event.to_json() + "\n")


def write_json(path: Path, record: Record) -> None:
    """Write a record atomically (a reader never sees half of it)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record.model_dump(mode="json", exclude_none=True), indent=2) + "\n")
    tmp.replace(path)
