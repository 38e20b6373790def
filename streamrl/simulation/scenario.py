"""The simulator's input: a scenario file (YAML, camelCase like an RLJob): mode, dispatch,
workload, stage costs, pools and datacenters, links, autoscaling. Knows the format and its
checks, not how a run unfolds (simulator.py) or what seconds cost (stages.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic.alias_generators import to_snake

from streamrl.spec import AutoscalingSpec, DispatchSpec, PipelineMode, PipelineSpec, SpecError, SpecModel
from streamrl.spec.job import field_path

ORACLE_LENGTHS = "(simulated: the true lengths)"
"""What stands in for `dispatch.oracleLengths` in a scenario: the oracle knows the drawn lengths."""


class AlgorithmSection(SpecModel):
    num_iterations: int = Field(default=10, ge=1)
    """Optimizer steps to simulate."""
    prompts_per_step: int = Field(default=64, ge=1)
    """Prompts per iteration."""
    group_size: int = Field(default=8, ge=1)
    """Samples per prompt."""
    micro_batch_size: int = Field(default=32, ge=1)
    """Samples per forward/backward (each micro-batch is padded to its longest sample)."""


class LognormalLengths(SpecModel):
    """Output lengths drawn per sample: a prompt's own median (lognormal over prompts) times a
    per-sample lognormal factor; `promptShare` of the log-variance belongs to the prompt, which
    is the part a ranker can learn."""

    type: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0)
    """Median output length at iteration 0, tokens."""
    sigma: float = Field(default=1.0, ge=0)
    """Standard deviation of log(length) over all samples (p99/p50 = exp(2.33 sigma): 8 at 0.9)."""
    prompt_share: float = Field(default=0.7, ge=0, le=1)
    """Fraction of log(length)'s variance that is the prompt's (the rest varies sample to sample)."""


class FileLengths(SpecModel):
    """Output lengths from a run's `lengths.jsonl` (one line per prompt: its samples' lengths).
    `replay`: iteration j uses the prompts the run consumed in iteration j, in their order
    (cycling when the scenario runs longer); `empirical`: prompts drawn at random from the file."""

    type: Literal["replay", "empirical"]
    path: str
    """The `lengths.jsonl` of a run (`streamrl run --out DIR` writes DIR/lengths.jsonl)."""


LengthsSpec = Annotated[LognormalLengths | FileLengths, Field(discriminator="type")]


class WorkloadSection(SpecModel):
    prompt_tokens: int = Field(default=256, ge=0)
    """Tokens of every prompt (with promptTokensSigma: their median)."""
    prompt_tokens_sigma: float = Field(default=0.0, ge=0, le=3)
    """Spread of prompt lengths over prompts: standard deviation of log(prompt tokens), lognormal
    around promptTokens (0: every prompt promptTokens long), clipped to maxPromptTokens. A prompt's
    length sets its prefill and every sample's context and trained tokens."""
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    """Longest prompt (unset: 8 x promptTokens)."""
    max_new_tokens: int = Field(default=4096, ge=1)
    """Longest output; drawn lengths are clipped to it."""
    lengths: LengthsSpec
    """The output-length distribution."""
    median_growth_per_iteration: float = Field(default=0.0, ge=-0.5, le=1.0)
    """Drift: lengths grow by this factor per iteration (0.01 = 1% longer each iteration), clipped to maxNewTokens."""
    growth: Literal["geometric", "linear"] = "geometric"
    """How the drift accumulates: `geometric` multiplies lengths by (1 + rate)^iteration,
    `linear` by 1 + rate x iteration (the steady rise RL runs show as reasoning lengthens)."""
    ranker_log_error: float = Field(default=0.5, ge=0)
    """skewness-aware: standard deviation of log(predicted / true mean length) of a prompt (0 = as the oracle)."""
    ranker_predictions: str | None = None
    """skewness-aware: a run's `lengths.jsonl` whose `predicted_length`s (what its ranker said of each
    prompt, by iteration and position) stand in for drawn predictions; prompts it has none for
    are drawn with rankerLogError. The run must have dispatched with predictions."""


class TableGeneration(SpecModel):
    """A replica's seconds given as numbers: PTL(BS) points (as a generator measures them)."""

    type: Literal["table"] = "table"
    decode_step_seconds: list[tuple[int, float]] = Field(min_length=1)
    """[[batch size, seconds per decode step], ...], interpolated linearly (the planner's PTL)."""
    context_seconds_per_token: float = Field(default=0.0, ge=0)
    """Added to a step per running sequence per token of its context (KV-cache reads); 0 = context-free."""
    prefill_seconds_per_token: float = Field(default=0.0, ge=0)
    """Seconds to prefill one prompt token..."""
    prefill_seconds_per_step: float = Field(default=0.0, ge=0)
    """...plus this once per engine step that admits prompts."""
    max_batch_size: int = Field(ge=1)
    """The most sequences one replica runs at once."""
    sample_seconds: float = Field(default=0.0, ge=0)
    """Seconds a replica spends on each sample it finishes besides decoding (sending it), before its next step."""


class TableTraining(SpecModel):
    """The trainer's seconds given as numbers."""

    type: Literal["table"] = "table"
    seconds_per_token: float = Field(ge=0)
    """Forward and backward seconds per trained (padded) token, the whole trainer."""
    step_seconds: float = Field(default=0.0, ge=0)
    """The optimizer step closing an iteration."""
    publish_seconds: float = Field(default=0.0, ge=0)
    """Gathering the weights and putting them in the weight store."""
    micro_batch_seconds: float = Field(default=0.0, ge=0)
    """Added to forward and backward per micro-batch, whatever its tokens."""
    sample_seconds: float = Field(default=0.0, ge=0)
    """The trainer's process per sample it takes in (intake, scoring, grouping): a sample arriving
    while it trains delays its training by this much (one arriving while it waits costs nothing)."""
    switch_to_training_seconds: float = Field(default=0.0, ge=0)
    """Colocated mode: from the last sample to the first micro-batch (the engine's KV cache
    released, the trainer's state back on the device)."""
    switch_to_generation_seconds: float = Field(default=0.0, ge=0)
    """Colocated mode: from the published version to generating again (the trainer's state to
    host memory, the weights resharded, the KV cache allocated)."""


class ProfileCost(SpecModel):
    """Seconds measured by `streamrl profile` (its JSON file): for a pool, PTL(BS), prefill, the
    weight load and each sample's send (half the measured wire; in colocated mode, what serving
    takes per sample beside the engine's steps, in the one process); for the trainer, forward/backward per padded
    token and per micro-batch, the optimizer step, publishing and each sample's receive and intake."""

    type: Literal["profile"] = "profile"
    path: str
    """The profile file."""


class AnalyticGeneration(SpecModel):
    """The roofline over a catalog GPU (needs the scenario's `model`)."""

    type: Literal["analytic"] = "analytic"
    gpu: str
    """A GPU type of the catalog (`H20`, `H100`, ...)."""
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    """GPUs of one replica's tensor-parallel group (within one node)."""


class AnalyticTraining(SpecModel):
    """6N FLOPs per token at an MFU over catalog GPUs (needs the scenario's `model`)."""

    type: Literal["analytic"] = "analytic"
    gpu: str
    """A GPU type of the catalog."""
    algorithm: Literal["grpo", "ppo"] = "grpo"
    """`ppo` adds a critic's passes."""
    reference: bool = False
    """A reference model's forward (a KL term)."""
    activation_checkpointing: bool = False
    """The trainer's `memory.activationCheckpointing`: less activation memory, one more forward."""
    cpu_offload: bool = False
    """The trainer's `memory.cpuOffload`: model state in host memory, copies and a host optimizer step."""
    tensor_parallel: int = Field(default=1, ge=1, le=8)
    """The trainer's `memory.tensorParallel`: a layer's weights and activations split that many
    ways, for two all-reduces per layer per pass."""


GenerationCostSpec = Annotated[TableGeneration | ProfileCost | AnalyticGeneration, Field(discriminator="type")]
TrainingCostSpec = Annotated[TableTraining | ProfileCost | AnalyticTraining, Field(discriminator="type")]


class PoolSection(SpecModel):
    name: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40)
    """Pool name."""
    replicas: int = Field(default=1, ge=0)
    """Replicas at the start."""
    cost: GenerationCostSpec
    """Where one replica's seconds come from."""
    gpus_per_replica: int | None = Field(default=None, ge=1)
    """GPUs one replica holds (default: the analytic cost's tensorParallel, else 1)."""
    gpu_hour_cost: float | None = Field(default=None, gt=0)
    """Cost of one GPU for an hour (default: the catalog's relativeCost of the analytic GPU, else 1)."""
    max_batch_size: int | None = Field(default=None, ge=1)
    """Cap on running sequences below what the cost allows (the engine's maxBatchSize)."""
    datacenter: str = "main"
    """Where the pool runs; a pool outside the trainer's datacenter fetches weights over the cross link."""
    weight_relay: bool = True
    """One replica fetches each version from the trainer and its peers fetch from it (the product's default)."""
    min_replicas: int = Field(default=0, ge=0)
    """Autoscaling: the fewest replicas."""
    max_replicas: int | None = Field(default=None, ge=1)
    """Autoscaling: the most replicas (unset = `replicas`: no growth)."""
    join_seconds: float = Field(default=60.0, ge=0)
    """Autoscaling: seconds from adding a replica to its Hello (start-up, model load)."""


class TrainerSection(SpecModel):
    gpus: int = Field(default=1, ge=1)
    """GPUs of the trainer (in colocated mode, also the generators')."""
    cost: TrainingCostSpec
    """Where the trainer's seconds come from."""
    gpu_hour_cost: float | None = Field(default=None, gt=0)
    """Cost of one GPU for an hour (default: the catalog's relativeCost of the analytic GPU, else 1)."""
    datacenter: str = "main"
    """Where the trainer runs."""


class LinkSection(SpecModel):
    bandwidth_gbps: float = Field(gt=0)
    """Gigabits per second one transfer gets; transfers from one source queue behind each other."""
    latency_ms: float = Field(default=0.0, ge=0)
    """One-way latency, milliseconds (also delays each sample crossing it)."""


class NetworkSection(SpecModel):
    local: LinkSection = Field(default_factory=lambda: LinkSection(bandwidth_gbps=100.0, latency_ms=0.05))
    """Within a datacenter (the trainer's egress, a relaying replica's egress)."""
    cross_datacenter: LinkSection = Field(default_factory=lambda: LinkSection(bandwidth_gbps=10.0, latency_ms=30.0))
    """The one link between the two datacenters."""


class WeightsSection(SpecModel):
    size_bytes: float | None = Field(default=None, gt=0)
    """Bytes of one weight version (default: the model's parameters x 2, BF16)."""
    load_seconds: float | None = Field(default=None, ge=0)
    """Seconds a replica pauses decoding to swap a fetched version in (unset: each pool's profile's
    measured weight load, 0 for other costs)."""


class PlacementSection(SpecModel):
    """Where the processes run. Unset: every stage on hardware of its own (a cluster)."""

    cores: int | None = Field(default=None, ge=1)
    """Simulate `streamrl run` on one machine of this many cores (a CPU profile's `hardware.cores`):
    the trainer's process takes the first core and each replica the next one, round-robin, as the
    run hands cores out. A replica on the trainer's core loses to it the trainer's intake of every
    sample taken in while the replica decodes (paid between its steps). Not modelled: training
    beside a replica on one core (streaming modes with more processes than cores), colocated mode
    (one process on every core)."""


class Scenario(SpecModel):
    """One simulated run."""

    name: str = "scenario"
    """What to call it in tables and plots."""
    seed: int = 0
    """Seed of the drawn lengths and predictions (the same seed gives every mode and policy the same samples)."""
    model: str | None = None
    """A catalog model name (`qwen2.5-32b`) or a Hugging Face config.json path; needed by analytic costs
    and for the weights' size."""
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec)
    """The RLJob's `pipeline` (mode, ...)."""
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    """Batch shape."""
    workload: WorkloadSection
    """Prompts and output lengths."""
    dispatch: DispatchSpec = Field(default_factory=DispatchSpec)
    """The RLJob's `generators.dispatch` (policy random-fifo, skewness-aware or oracle; longTailFraction, ...)."""
    trainer: TrainerSection
    """The training stage."""
    generators: list[PoolSection] = Field(min_length=1, max_length=16)
    """Generator pools."""
    network: NetworkSection = Field(default_factory=NetworkSection)
    """Weight links."""
    weights: WeightsSection = Field(default_factory=WeightsSection)
    """Weight versions."""
    placement: PlacementSection = Field(default_factory=PlacementSection)
    """Processes sharing one machine's cores (a local run), or not."""
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """The RLJob's `autoscaling`; mode Internal runs the product's policy on the simulated metrics."""
    assumptions: dict[str, Any] = Field(default_factory=dict)
    """Overrides of the analytic model's assumptions (streamrl/planning/roofline.py `Assumptions`)."""

    @model_validator(mode="before")
    @classmethod
    def _oracle_knows(cls, data: Any) -> Any:
        """The oracle's lengths are the drawn ones: no file to name."""
        if isinstance(data, dict) and isinstance(data.get("dispatch"), dict):
            d = data["dispatch"]
            if d.get("policy") == "oracle" and not (d.get("oracleLengths") or d.get("oracle_lengths")):
                data = {**data, "dispatch": {**d, "oracleLengths": ORACLE_LENGTHS}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        names = [p.name for p in self.generators]
        if len(set(names)) != len(names):
            raise ValueError("generators: pool names must be unique")
        if sum(p.replicas for p in self.generators) < 1:
            raise ValueError("generators: at least one replica is needed")
        centres = {self.trainer.datacenter, *(p.datacenter for p in self.generators)}
        if len(centres) > 2:
            raise ValueError(f"generators[].datacenter: at most two datacenters (one cross link), got "
                             f"{', '.join(sorted(centres))}")
        if self.pipeline.mode == PipelineMode.colocated:
            far = [p.name for p in self.generators if p.datacenter != self.trainer.datacenter]
            if far:
                raise ValueError(f"generators[].datacenter: colocated pools share the trainer's GPUs, so they "
                                 f"run in its datacenter ({', '.join(far)} do not)")
        for i, p in enumerate(self.generators):
            if p.max_replicas is not None and p.max_replicas < max(p.min_replicas, p.replicas):
                raise ValueError(f"generators[{i}].maxReplicas: {p.max_replicas} is below replicas or minReplicas")
        return self


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a decoded scenario; SpecError naming every bad field."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a scenario must be a mapping, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = [p for p in e["loc"] if not str(p).startswith("function-")]
            # a discriminated union's tag is pydantic's, not a field
            loc = [p for i, p in enumerate(loc)
                   if not (i and loc[i - 1] in ("cost", "lengths") and p in ("table", "profile", "analytic",
                                                                                "lognormal", "replay", "empirical"))]
            msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
            problems.append((field_path(tuple(loc)), msg))
        lines = [f"{source}: invalid scenario ({len(problems)} problem{'s' if len(problems) > 1 else ''})"]
        raise SpecError("\n".join(lines + [f"  {w}: {m}" for w, m in problems]), tuple(problems)) from None


def load_scenario(path: str | Path, mode: str | None = None, policy: str | None = None,
                  iterations: int | None = None) -> Scenario:
    """Read and validate a scenario YAML file, with the command line's flags written in first
    (see `with_overrides`)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise SpecError(f"{path}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from None
    return parse_scenario(with_overrides(data, mode, policy, iterations), str(path))


def with_overrides(data: Any, mode: str | None = None, policy: str | None = None,
                   iterations: int | None = None) -> Any:
    """The decoded scenario with its pipeline mode, dispatch policy or iterations replaced (the
    command line's flags), before it is validated. The sections stay as the file wrote them, so
    they are read exactly as an RLJob's: validating, dumping and validating again would write
    every default out as if the user had set it (the default rate policy's `value: 1` would
    then be refused beside `autoscaling.step: 2`)."""
    if not isinstance(data, dict):
        return data  # parse_scenario says why
    for section, key, value in (("pipeline", "mode", mode), ("dispatch", "policy", policy),
                                ("algorithm", "numIterations", iterations)):
        fields = data.get(section) or {}
        if value is not None and isinstance(fields, dict):
            fields = {k: v for k, v in fields.items() if k != to_snake(key)}  # one spelling of the key
            data = {**data, section: {**fields, key: value}}
    return data


def scenario_path(path: str, base: Path | None) -> Path:
    """A file a scenario names: a relative path is the scenario file's folder's where it exists
    there, else the working directory's."""
    p = Path(path)
    if not p.is_absolute() and base is not None and (base / p).exists():
        return base / p
    return p
