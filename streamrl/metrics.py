"""Every metric name StreamRL exports, and the stage clock that feeds the bubble metrics.

Services, the run recorder, the Prometheus rules, the dashboards and the autoscaler use
these names only; docs/observability.md defines each one (a test keeps it complete).

- pipeline-bubble ratio = trainer seconds idle waiting for samples / wall seconds;
- skewness-bubble ratio = generator seconds decoding below `lowOccupancy` of its batch cap
  while its work is unfinished / wall seconds (summed over generators, over their number);
- utilisation of a stage = its busy seconds / wall seconds.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from streamrl.records import TrainerPhase
from streamrl.timeline import Timeline

BUSY_SECONDS = "streamrl_stage_busy_seconds"
IDLE_SECONDS = "streamrl_stage_idle_seconds"
GENERATED_TOKENS = "streamrl_generated_tokens"
SAMPLES_STREAMED = "streamrl_samples_streamed"
SAMPLES_ACCEPTED = "streamrl_samples_accepted"
SAMPLES_DUPLICATE = "streamrl_samples_duplicate_dropped"
SAMPLES_REDISPATCHED = "streamrl_samples_redispatched"
SAMPLES_STALE = "streamrl_samples_stale_dropped"
SAMPLES_REFUSED = "streamrl_samples_refused"
SAMPLE_STALENESS = "streamrl_sample_staleness"
POLICY_VERSION = "streamrl_policy_version"
ITERATION = "streamrl_iteration"
REWARD_MEAN = "streamrl_reward_mean"
PIPELINE_BUBBLE_RATIO = "streamrl_pipeline_bubble_ratio"
TRAIN_STEP_SECONDS = "streamrl_train_step_seconds"
WEIGHT_SYNC_SECONDS = "streamrl_weight_sync_seconds"
WEIGHT_FETCH_SECONDS = "streamrl_weight_fetch_seconds"
WEIGHT_SYNC_BYTES = "streamrl_weight_sync_bytes"
WEIGHT_SERVED_BYTES = "streamrl_weight_served_bytes"
MODEL_READ_BYTES = "streamrl_model_read_bytes"
WEIGHT_PUBLISH_SECONDS = "streamrl_weight_publish_seconds"
CHECKPOINT_WAIT_SECONDS = "streamrl_trainer_checkpoint_wait_seconds"
CHECKPOINT_ITERATION = "streamrl_trainer_checkpoint_iteration"
BATCH_OCCUPANCY = "streamrl_batch_occupancy"
SKEWNESS_BUBBLE_SECONDS = "streamrl_skewness_bubble_seconds"
GENERATION_BARRIER_SECONDS = "streamrl_generation_barrier_seconds"
GENERATOR_JOIN_SECONDS = "streamrl_generator_join_seconds"
CONNECTED_GENERATORS = "streamrl_connected_generators"
POOL_REPLICAS = "streamrl_pool_replicas"
PHASE = "streamrl_phase"
ITERATION_GENERATION_SECONDS = "streamrl_iteration_generation_seconds"
ITERATION_TRAIN_SECONDS = "streamrl_iteration_train_seconds"
ITERATION_WALL_SECONDS = "streamrl_iteration_wall_seconds"
SKEWNESS_BUBBLE_RATIO = "streamrl_skewness_bubble_ratio"
SAMPLE_STALENESS_MAX = "streamrl_sample_staleness_max"
MAX_STALENESS = "streamrl_max_staleness"
OUTPUT_LENGTH = "streamrl_output_length_tokens"
PREDICTED_LENGTH_MEAN = "streamrl_predicted_length_mean"
ACTUAL_LENGTH_MEAN = "streamrl_actual_length_mean"
MISMATCH_ABS_LOGP = "streamrl_mismatch_abs_logprob"
MISMATCH_KL = "streamrl_mismatch_kl"
MISMATCH_RATIO_MAX = "streamrl_mismatch_ratio_max"
IMPORTANCE_CAPPED_FRACTION = "streamrl_importance_capped_fraction"
ENGINE_RUNNING = "streamrl_engine_running_sequences"
ENGINE_WAITING = "streamrl_engine_waiting_sequences"
ENGINE_KV_CACHE_USAGE = "streamrl_engine_kv_cache_usage_ratio"
TRAINER_RANK_INFO = "streamrl_trainer_rank_info"
TRAINER_FORWARD_BACKWARD_SECONDS = "streamrl_trainer_forward_backward_seconds"
TRAINER_COLLECTIVE_SECONDS = "streamrl_trainer_collective_seconds"

AUTOSCALER_DESIRED_REPLICAS = "streamrl_autoscaler_desired_replicas"
AUTOSCALER_DECISIONS = "streamrl_autoscaler_decisions"
AUTOSCALER_TRAINER_BOUND = "streamrl_autoscaler_trainer_bound"

RANKER_RECALL = "streamrl_ranker_recall"
RANKER_OBSERVATIONS = "streamrl_ranker_observations"
RANKER_LOG_ERROR = "streamrl_ranker_abs_log_error"

# Busy reasons (the timeline only; the busy counter has none).
LOW_OCCUPANCY = "low_occupancy"
"""Generator: decoding in a skewness bubble (below lowOccupancy of its batch cap, nothing waiting)."""

# Idle reasons.
WAITING_GENERATORS = "waiting_generators"
"""Trainer: before enough generators joined (start-up; not a pipeline bubble)."""
WAITING_SAMPLES = "waiting_samples"
WAITING_LEADER = "waiting_leader"
"""A trainer rank other than 0: waiting for rank 0's next command (its samples, its step)."""
WAITING_WEIGHTS = "waiting_weights"
NO_WORK = "no_work"

# Kinds of a trainer rank's collective seconds (streamrl_trainer_collective_seconds).
FORWARD_ALL_GATHER = "forward_all_gather"
"""FSDP2's pre-forward of a sharded unit: the all-gather of its parameters and the wait for it."""
OPTIMIZER_STEP = "optimizer_step"
"""Clipping (the all-reduce of the gradient norm) and the optimizer step."""
SCATTER = "scatter"
"""Rank 0 handing every rank its command (and its share of samples) on the control group."""
ALL_REDUCE = "all_reduce"
"""The sums and maxima of a step's statistics over the ranks, on the control group."""
GATHER_WEIGHTS = "gather_weights"
"""The full state dict gathered to rank 0's CPU for publishing (or the final model)."""
COLLECTIVE_KINDS = (FORWARD_ALL_GATHER, OPTIMIZER_STEP, SCATTER, ALL_REDUCE, GATHER_WEIGHTS)


COMMON_METRICS = frozenset({BUSY_SECONDS, IDLE_SECONDS, POLICY_VERSION, WEIGHT_SERVED_BYTES, MODEL_READ_BYTES})
GENERATOR_METRICS = frozenset({
    GENERATED_TOKENS, SAMPLES_STREAMED, WEIGHT_SYNC_SECONDS, WEIGHT_FETCH_SECONDS, WEIGHT_SYNC_BYTES,
    BATCH_OCCUPANCY, SKEWNESS_BUBBLE_SECONDS, ENGINE_RUNNING, ENGINE_WAITING,
})
"""Exported by generators only (a trainer exporting zeros would skew per-generator averages)."""



class ServiceMetrics:
    """The collectors of one process, on its own registry."""

    def __init__(self, stage: str, timeline: Path | None = None):
        self.stage = stage
        r = self.registry = CollectorRegistry()
        self.busy_seconds = Counter(BUSY_SECONDS, "Seconds the stage spent working", ["stage"], registry=r)
        self.idle_seconds = Counter(IDLE_SECONDS, "Seconds the stage sat idle, by reason", ["stage", "reason"],
                                    registry=r)
        self.generated_tokens = Counter(GENERATED_TOKENS, "Tokens generated", registry=r)
        self.samples_streamed = Counter(SAMPLES_STREAMED, "Samples sent to the trainer by a generator", registry=r)
        self.samples_accepted = Counter(SAMPLES_ACCEPTED, "Samples the trainer accepted", registry=r)
        self.samples_duplicate = Counter(SAMPLES_DUPLICATE, "Samples dropped as already received", registry=r)
        self.samples_redispatched = Counter(
            SAMPLES_REDISPATCHED, "Samples dispatched again after their replica vanished", registry=r
        )
        self.samples_stale = Counter(
            SAMPLES_STALE, "Samples dropped at consumption for exceeding max_staleness (and re-issued)", registry=r
        )
        self.samples_refused = Counter(
            SAMPLES_REFUSED, "Samples (and Connect messages) the trainer refused, by reason", ["reason"], registry=r)
        self.sample_staleness = Histogram(
            SAMPLE_STALENESS, "Trainer policy_version minus the sample's, at consumption (versions)",
            buckets=(0, 1, 2, 3, 4, 8), registry=r,
        )
        self.policy_version = Gauge(POLICY_VERSION, "Weight version in use", registry=r)
        self.iteration = Gauge(ITERATION, "Iterations completed", registry=r)
        self.reward_mean = Gauge(REWARD_MEAN, "Mean reward of the last iteration", registry=r)
        self.pipeline_bubble_ratio = Gauge(
            PIPELINE_BUBBLE_RATIO, "Trainer idle-waiting-for-samples / wall time, last iteration", registry=r
        )
        self.train_step_seconds = Histogram(TRAIN_STEP_SECONDS, "Seconds of one optimizer step", registry=r)
        self.weight_sync_seconds = Histogram(
            WEIGHT_SYNC_SECONDS, "Generator: seconds from a new-weights notice to the swap", registry=r,
        )
        self.weight_fetch_seconds = Histogram(
            WEIGHT_FETCH_SECONDS, "Generator: seconds to fetch and verify a version, by source (trainer|peer)",
            ["source"], registry=r,
        )
        self.weight_sync_bytes = Counter(
            WEIGHT_SYNC_BYTES, "Generator: weight bytes received, by source (trainer|peer)", ["source"], registry=r
        )
        self.weight_served_bytes = Counter(WEIGHT_SERVED_BYTES, "Weight bytes served to generators", registry=r)
        self.model_read_bytes = Counter(
            MODEL_READ_BYTES, "Bytes of the checkpoint's weight files this process loaded from its model directory "
            "(none for a replica that booted from the trainer)", registry=r)
        self.weight_publish_seconds = Histogram(
            WEIGHT_PUBLISH_SECONDS, "Trainer: seconds to serialize and publish a version", registry=r,
        )
        self.checkpoint_wait_seconds = Counter(
            CHECKPOINT_WAIT_SECONDS, "Trainer: seconds training waited on checkpoints (copying the state off the "
            "model, and a previous save still being written)", registry=r,
        )
        self.checkpoint_iteration = Gauge(
            CHECKPOINT_ITERATION, "Trainer: iterations the newest complete checkpoint holds", registry=r,
        )
        self.batch_occupancy = Gauge(BATCH_OCCUPANCY, "Running sequences / engine batch cap", registry=r)
        self.skewness_bubble_seconds = Counter(
            SKEWNESS_BUBBLE_SECONDS,
            "Generator decode seconds spent below the low-occupancy fraction of its batch cap with work unfinished",
            registry=r,
        )
        self.generation_barrier_seconds = Counter(
            GENERATION_BARRIER_SECONDS,
            "Trainer: seconds with no work pending or out on any generator (each must wait for the trainer)",
            registry=r)
        self.generator_join_seconds = Histogram(
            GENERATOR_JOIN_SECONDS, "Trainer: seconds from a replica's process start to its first accepted sample",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 300), registry=r)
        self.connected_generators = Gauge(CONNECTED_GENERATORS, "Generators connected to the trainer", registry=r)
        self.pool_replicas = Gauge(POOL_REPLICAS, "Generators connected to the trainer, by pool", ["pool"], registry=r)
        self.phase = Gauge(PHASE, "1 for the run's current phase, 0 for the others", ["phase"], registry=r)
        self.iteration_generation_seconds = Gauge(
            ITERATION_GENERATION_SECONDS, "Last iteration: seconds from its start until its last sample arrived",
            registry=r)
        self.iteration_train_seconds = Gauge(
            ITERATION_TRAIN_SECONDS, "Last iteration: seconds of forward/backward and optimizer work", registry=r)
        self.iteration_wall_seconds = Gauge(ITERATION_WALL_SECONDS, "Last iteration: wall seconds", registry=r)
        self.skewness_bubble_ratio = Gauge(
            SKEWNESS_BUBBLE_RATIO, "Last iteration: generator skewness-bubble seconds / (generators x wall seconds)",
            registry=r)
        self.sample_staleness_max = Gauge(
            SAMPLE_STALENESS_MAX, "Last iteration: largest staleness of a consumed sample (versions)", registry=r)
        self.max_staleness = Gauge(MAX_STALENESS, "The staleness contract, pipeline.maxStaleness (versions)",
                                   registry=r)
        self.output_length = Histogram(
            OUTPUT_LENGTH, "Completion tokens of each consumed sample",
            buckets=(4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768), registry=r)
        self.predicted_length_mean = Gauge(
            PREDICTED_LENGTH_MEAN, "Last iteration: mean predicted output length (dispatch with predictions)",
            registry=r)
        self.actual_length_mean = Gauge(ACTUAL_LENGTH_MEAN, "Last iteration: mean actual output length",
                                        registry=r)
        self.mismatch_abs_logp = Gauge(
            MISMATCH_ABS_LOGP, "Last iteration: mean |log p learner - log p engine| of the sampled tokens", registry=r)
        self.mismatch_kl = Gauge(MISMATCH_KL, "Last iteration: mean k3 estimate of KL(engine || learner) per token",
                                 registry=r)
        self.mismatch_ratio_max = Gauge(
            MISMATCH_RATIO_MAX, "Last iteration: largest learner/engine probability ratio of a token, either way",
            registry=r)
        self.importance_capped_fraction = Gauge(
            IMPORTANCE_CAPPED_FRACTION, "Last iteration: fraction of tokens whose importance weight was capped",
            registry=r)
        self.engine_running = Gauge(ENGINE_RUNNING, "Generator: sequences decoding now", registry=r)
        self.engine_waiting = Gauge(ENGINE_WAITING, "Generator: samples assigned and waiting to start",
                                    registry=r)
        self.engine_kv_cache_usage = Gauge(ENGINE_KV_CACHE_USAGE, "Generator: fraction of the engine's KV cache "
                                           "in use (0-1)", registry=r)
        self.trainer_rank_info = Gauge(
            TRAINER_RANK_INFO, "Trainer: 1, labelled with this process's rank and the world size (to join on instance)",
            ["rank", "world_size"], registry=r)
        self.trainer_forward_backward_seconds = Histogram(
            TRAINER_FORWARD_BACKWARD_SECONDS, "Trainer: seconds of one micro-batch's forward and backward, by rank",
            ["rank"], buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=r)
        self.trainer_collective_seconds = Counter(
            TRAINER_COLLECTIVE_SECONDS, "Trainer: seconds in the collectives a rank can time, by rank and kind",
            ["rank", "kind"], registry=r)
        self.clock = StageClock(self, Timeline(timeline) if timeline else None)
        # Each stage exports its own series only; the others still work, unregistered.
        for collector in [v for v in vars(self).values() if isinstance(v, (Counter, Gauge, Histogram))]:
            name = next(iter(collector.describe())).name
            if name not in COMMON_METRICS and (name in GENERATOR_METRICS) != (stage == "generator"):
                r.unregister(collector)

    def set_phase(self, phase: TrainerPhase) -> None:
        for p in TrainerPhase:
            self.phase.labels(p.value).set(1.0 if p == phase else 0.0)


class RankerMetrics:
    """The ranker's collectors, on its own registry."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.recall = Gauge(RANKER_RECALL, "Recall of the true top-x% longest over the recent window", ["top"],
                            registry=r)
        self.observations = Counter(RANKER_OBSERVATIONS, "Prompts whose output lengths were observed", registry=r)
        self.abs_log_error = Histogram(
            RANKER_LOG_ERROR, "|log(1 + predicted) - log(1 + actual)| of mean output length, before learning it",
            buckets=(0.05, 0.1, 0.2, 0.5, 1.0, 2.0), registry=r,
        )


class AutoscalerMetrics:
    """The autoscaler's collectors (the local runner's or the operator's), labelled by RLJob
    since one operator scales many jobs."""

    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.desired_replicas = Gauge(AUTOSCALER_DESIRED_REPLICAS, "Generator replicas the autoscaler wants, by pool",
                                      ["rljob", "pool"], registry=r)
        self.decisions = Counter(AUTOSCALER_DECISIONS, "Replicas added (direction=up) or removed (down), by pool",
                                 ["rljob", "pool", "direction"], registry=r)
        self.trainer_bound = Gauge(AUTOSCALER_TRAINER_BOUND,
                                   "1 while training is the bottleneck and every pool is at its minimum",
                                   ["rljob"], registry=r)

    def record(self, rljob: str, desired: dict[str, int], step: int, pool: str | None, trainer_bound: bool) -> None:
        for name, n in desired.items():
            self.desired_replicas.labels(rljob, name).set(n)
            # Exported at 0 from the first round, so increase() reads 0 rather than nothing.
            for direction in ("up", "down"):
                self.decisions.labels(rljob, name, direction)
        if step and pool:
            self.decisions.labels(rljob, pool, "up" if step > 0 else "down").inc()
        self.trainer_bound.labels(rljob).set(1.0 if trainer_bound else 0.0)


class StageClock:
    """Attributes every second of a stage to busy(reason) or idle(reason); thread-safe.
    With a timeline it also writes each stretch in one state as a span (streamrl.timeline)."""

    def __init__(self, metrics: ServiceMetrics, timeline: Timeline | None = None):
        self._m = metrics
        self._lock = threading.Lock()
        self._state = ("idle", NO_WORK)
        self._since = time.monotonic()
        self._totals: dict[tuple[str, str], float] = {}
        self._timeline = timeline
        if timeline is not None:
            timeline.enter(self._state)

    def _switch(self, state: tuple[str, str]) -> None:
        with self._lock:
            now = time.monotonic()
            self._account(now)
            if state != self._state and self._timeline is not None:
                self._timeline.enter(state)
            self._state = state

    def close(self) -> None:
        """Write the current stretch and close the timeline."""
        with self._lock:
            self._account(time.monotonic())
            if self._timeline is not None:
                self._timeline.close()

    def _account(self, now: float) -> None:
        dt = now - self._since
        self._since = now
        self._totals[self._state] = self._totals.get(self._state, 0.0) + dt
        if self._state[0] == "busy":
            self._m.busy_seconds.labels(self._m.stage).inc(dt)
        else:
            self._m.idle_seconds.labels(self._m.stage, self._state[1]).inc(dt)

    def busy(self, reason: str = "") -> None:
        self._switch(("busy", reason))

    def idle(self, reason: str) -> None:
        self._switch(("idle", reason))

    def totals(self) -> dict[tuple[str, str], float]:
        """Seconds per (state, reason) so far, including the current stretch."""
        with self._lock:
            self._account(time.monotonic())
            return dict(self._totals)

    def seconds(self, state: str, reason: str | None = "") -> float:
        """Seconds in `state` with `reason` (None: any reason)."""
        if reason is None:
            return sum(v for (st, _), v in self.totals().items() if st == state)
        return self.totals().get((state, reason), 0.0)
