"""A measured profile: what `streamrl profile` writes (hardware, model, engine; PTL(BS), prefill,
training, the optimizer step, publishing, weight loads, each sample's intake and wire), how it is
read back, the stage costs it gives the planner and the simulator, and its PTL plot. Knows
numbers only: the measuring is the services' (generator/profile.py, trainer/profile.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, field_validator

from streamrl.latency import interpolate_ptl
from streamrl.planning.costs import LinearTrainingCost
from streamrl.planning.shape import ModelShape
from streamrl.records import Record, write_json

log = logging.getLogger(__name__)

PROFILE_VERSION = 6
"""1: PTL timed the decoder's forward alone, training was seconds per token only, and the
per-sample, per-micro-batch and weight-load costs were not measured (they read as 0).
2: prefill was one admission of 4 prompts divided by their tokens (no per-step part).
3: prefill was timed admitting into an idle engine, greedily, and the wire with samples
written back-to-back.
4: the engine and the learner were measured on two threads, each with an OpenMP team of its
own (more than one torch thread only), and colocated serving's cost per sample was the
coordinator's intake alone.
5: the stream's two ends were measured together in one process (sample_stream_s alone) and
the cost split evenly between them."""
_OLD_VERSIONS = {
    1: "its PTL times the decoder's forward alone and it lacks the per-sample, per-micro-batch and weight-load "
       "costs (read as 0), so it predicts too fast",
    2: "it prices prefill per prompt token alone, with a small admission's fixed cost spread over its tokens, so "
       "it over-prices steps that admit many prompts",
    3: "it times admissions into an idle engine and samples written back-to-back, both cheaper than serving "
       "(admitting beside a running batch, samples leaving a few per decode step), so it predicts too fast",
    4: "it prices a colocated sample at the coordinator's intake alone (about a tenth of what serving takes "
       "beside the engine's steps) and, at more than one torch thread, measures the engine and the learner on "
       "two threads with an OpenMP team each, where a process now runs both on one (streamrl.compute)",
    5: "it measures the stream's two ends in one process, where they share wake-ups, an event loop and gRPC's "
       "threads (the tiny job: 223-308 us a sample against 270-402 us from two processes), and splits that "
       "evenly, where the trainer's end costs more than the replica's, so it predicts the trainer too fast",
}


class ProfileHardware(Record):
    device: str
    """torch device the measurements ran on (`cpu`, `cuda`)."""
    name: str
    """The processor's name (CPU model, or the GPU's as CUDA reports it)."""
    gpu_type: str | None = None
    """The catalog GPU type this hardware is (given to `streamrl profile --gpu-type`): the planner
    uses this profile instead of the analytic model for that type."""
    threads: int = 1
    """torch threads of each measurement."""
    cores: int = 0
    """Cores the measuring process could run on (0: not recorded, a version-1 profile)."""
    torch_version: str = ""


class ProfileModel(Record):
    name: str
    """The model's directory name, or `builtin-tiny`/`builtin-small`."""
    num_params: int
    dtype: str
    shape: ModelShape | None = None
    """Its dimensions (from its config.json)."""


class ProfileEngine(Record):
    type: str
    """Engine backend (`torch`, `vllm`): the pool's engine.type."""
    max_batch_size: int
    """The engine's cap on running sequences: a replica's max_batch."""
    device: str


class Profile(Record):
    """One job's model measured on one machine."""

    version: int = PROFILE_VERSION
    created: str
    """When it was measured (ISO 8601, UTC)."""
    hardware: ProfileHardware
    model: ProfileModel
    engine: ProfileEngine
    ptl: list[tuple[int, float]] = Field(min_length=1)
    """PTL(BS): (batch size, seconds per decode step of one replica), ascending batch size."""
    ptl_context: int
    """Tokens of context (prompt + generated) each sequence had while PTL was measured."""
    ptl_long_context: int = Field(default=0, ge=0)
    """The longer context PTL was measured again at, for ptl_context_s_per_token (0: not measured)."""
    ptl_context_s_per_token: float = Field(default=0.0, ge=0)
    """Seconds a decode step grows per running sequence per token of context beyond ptl_context
    (the torch engine attends every sequence over the longest one's context)."""
    prefill_s_per_token: float = Field(ge=0)
    """Seconds a step admitting prompts (prefill and first token) costs beyond its decode step,
    per prompt token, measured admitting beside a running batch as serving does..."""
    prefill_s_per_step: float = Field(default=0.0, ge=0)
    """...plus this once per admitting step (fitted over admissions of several sizes)."""
    train_micro_batch_size: int = Field(ge=1)
    """Samples per forward/backward (the job's algorithm.microBatchSize) while training was measured."""
    train_sequence_tokens: int = Field(ge=1)
    """Prompt + completion tokens of each trained sample."""
    train_world_size: int = Field(default=1, ge=1)
    """Trainer ranks that shared the measured work."""
    forward_backward_s_per_token: float = Field(ge=0)
    """Seconds of forward and backward per padded token of a micro-batch (over the whole trainer)."""
    forward_backward_s_per_micro_batch: float = Field(default=0.0, ge=0)
    """Seconds every micro-batch costs besides its tokens (packing, the loss, the learner's Python),
    fitted with forward_backward_s_per_token over micro-batches of several shapes."""
    optimizer_step_s: float = Field(ge=0)
    """Seconds of one optimizer step (gradient clipping included)."""
    publish_s: float = Field(ge=0)
    """Seconds to gather the full weights and put them in the weight store (serialised, chunked, hashed)."""
    weight_load_s: float = Field(default=0.0, ge=0)
    """Seconds a replica takes to swap a published version in once its bytes are here (decode, load)."""
    sample_intake_s: float = Field(default=0.0, ge=0)
    """Seconds the trainer's coordinator spends per sample it takes in (checks, scoring, grouping,
    dispatching more work), in process: what a colocated generator's samples cost."""
    sample_stream_s: float = Field(default=0.0, ge=0)
    """CPU seconds per sample over a loopback Connect stream, both ends together, the samples sent
    as a replica sends them, a few per decode step (the work out, the sample's conversion both
    ways, gRPC, the intake): intake plus the wire. From version 6 the two ends are processes of
    their own, each measured: this is their sum."""
    sample_stream_receive_s: float = Field(default=0.0, ge=0)
    """Of sample_stream_s, the receiving (trainer's) process's CPU seconds per sample: gRPC's
    threads, the conversion, the intake and the work going out (0: before version 6, not measured)."""
    sample_colocated_s: float = Field(default=0.0, ge=0)
    """Seconds per sample that colocated serving takes beyond its engine's steps, measured
    through the real composition (worker, hand-over, coordinator on its event loop): the
    worker's bookkeeping, the intake and dispatch, and the Python they hold the engine's thread
    back by. 0 (a profile before version 5): the intake stands in for it."""

    cache_release_s: float = Field(default=0.0, ge=0)
    """Colocated mode's switch to training on this machine: seconds for the idle engine to let go
    of its KV cache (the trainer's state is in host memory already; 0: not measured)."""
    cache_allocate_s: float = Field(default=0.0, ge=0)
    """Colocated mode's switch to generation beside publishing and loading the version: seconds
    to allocate the KV cache again (0: not measured)."""

    @field_validator("ptl")
    @classmethod
    def _ascending(cls, points: list[tuple[int, float]]) -> list[tuple[int, float]]:
        points = sorted(points)
        if any(b < 1 or s <= 0 for b, s in points):
            raise ValueError("every PTL point needs a batch size >= 1 and seconds > 0")
        return points

    def write(self, path: Path) -> None:
        write_json(Path(path), self)

    def sample_send_s(self) -> float:
        """A remote replica's seconds per sample it sends: the stream's cost beyond the receiving
        end's; before version 6 (the receiving end not measured), half the wire beyond the intake
        (an assumption: both ends, converting and passing through gRPC, cost alike)."""
        if self.sample_stream_receive_s:
            return max(0.0, self.sample_stream_s - self.sample_stream_receive_s)
        return max(0.0, self.sample_stream_s - self.sample_intake_s) / 2

    def sample_receive_s(self) -> float:
        """The trainer's seconds per sample a remote replica sends: its end of the stream as
        measured (the intake in it); before version 6, the intake and the other half of the wire."""
        return self.sample_stream_receive_s or self.sample_intake_s + self.sample_send_s()

    def sample_colocated_cost_s(self) -> float:
        """A colocated process's seconds per sample beside its engine's steps."""
        return self.sample_colocated_s or self.sample_intake_s

    def generation_cost(self) -> MeasuredGenerationCost:
        """A replica of this engine on this hardware (a GenerationCost)."""
        return MeasuredGenerationCost(tuple(self.ptl), self.prefill_s_per_token, self.engine.max_batch_size,
                                      self.ptl_context, self.ptl_context_s_per_token, self.engine.type == "torch",
                                      self.prefill_s_per_step)

    def switch_cost(self) -> MeasuredSwitchCost:
        """Colocated mode's switches as measured here (a SwitchCost)."""
        return MeasuredSwitchCost(self.cache_release_s, self.cache_allocate_s)

    def training_cost(self, num_gpus: int | None = None) -> LinearTrainingCost:
        """The trainer as measured (a TrainingCost); with `num_gpus`, forward/backward and the
        optimizer step scaled by world size / num_gpus (ideal data-parallel scaling, an
        assumption: measure the world size you plan where you can)."""
        scale = self.train_world_size / num_gpus if num_gpus else 1.0
        return LinearTrainingCost(self.forward_backward_s_per_token * scale, self.optimizer_step_s * scale,
                                  self.publish_s, self.forward_backward_s_per_micro_batch * scale)


def load_profile(path: str | Path) -> Profile:
    """Read a profile file; ValueError naming the file and the field."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"profile {path}: no such file (write one with `streamrl profile JOB --out {path}`)")
    profile = Profile.read(path)
    if profile.version < PROFILE_VERSION:
        why = "; ".join(_OLD_VERSIONS[v] for v in range(max(1, profile.version), PROFILE_VERSION))
        log.warning("profile %s is version %d: %s; measure again with `streamrl profile`", path, profile.version, why)
    return profile


@dataclass(frozen=True)
class MeasuredSwitchCost:
    to_training_seconds: float
    to_generation_seconds: float

    def to_training_s(self) -> float:
        return self.to_training_seconds

    def to_generation_s(self) -> float:
        return self.to_generation_seconds


@dataclass(frozen=True)
class MeasuredGenerationCost:
    """PTL(BS) interpolated over batch size, plus the measured growth per running sequence per
    token of context beyond the one PTL was measured at (none below it)."""

    ptl: tuple[tuple[int, float], ...]
    prefill_s_per_token: float
    max_batch: int
    ptl_context: int = 0
    context_s_per_token: float = 0.0
    padded_attention: bool = False
    """Every sequence attends over the longest one's context (the torch engine's slot cache):
    a caller passes the batch's longest context, not its mean."""
    prefill_s_per_step: float = 0.0

    def decode_step_s(self, batch: int, context: int) -> float:
        """Linear between measured batch sizes; beyond them, the nearest segment's slope (never
        below the fastest measured step); plus the context term."""
        return self._ptl(batch) + batch * max(0, context - self.ptl_context) * self.context_s_per_token

    def _ptl(self, batch: int) -> float:
        return interpolate_ptl(self.ptl, batch, floor=min(t for _, t in self.ptl))

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_s_per_step + tokens * self.prefill_s_per_token


def plot_ptl(profile: Profile, path: Path) -> Path:
    """PTL(BS) as a PNG: seconds per decode step and per generated token over batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batch = [b for b, _ in profile.ptl]
    step_ms = [s * 1e3 for _, s in profile.ptl]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(batch, step_ms, "o-", label="decode step (ms)")
    ax.plot(batch, [s / b for s, b in zip(step_ms, batch)], "s--", label="per generated token (ms)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (running sequences)")
    ax.set_ylabel("milliseconds")
    ax.set_title(f"PTL(BS): {profile.model.name} on {profile.hardware.gpu_type or profile.hardware.name}"[:80])
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
