"""The RLJob resource (apiVersion, kind, metadata, spec), reading and writing job files, and
errors that name every bad field as Kubernetes writes it (`spec.generators.pools[0].name`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator

from streamrl.spec.autoscaling import AutoscalingSpec
from streamrl.spec.base import SpecModel
from streamrl.spec.generators import GeneratorsSpec
from streamrl.spec.security import SecuritySpec
from streamrl.spec.services import RankerSpec, TrainerSpec
from streamrl.spec.training import AlgorithmSpec, CheckpointSpec, ModelSpec, PipelineSpec, RewardSpec, TaskSpec

GROUP = "streamrl.io"
"""The API group of StreamRL's resources (RLJob, RLCluster) and the prefix of its labels."""
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"


class SpecError(ValueError):
    """An RLJob file that cannot be used; the message names each bad field."""

    def __init__(self, message: str, problems: tuple[tuple[str, str], ...] = ()):
        super().__init__(message)
        self.problems = problems
        """(field, message) of each problem, e.g. ("spec.generators.pools[0].name", "..."); empty when
        the file could not be read as a mapping at all."""

class RLJobSpec(SpecModel):
    """Everything an RL post-training run needs."""

    model: ModelSpec
    """Policy model (required: a job must say what it trains, e.g. `model: {source: builtin-tiny}`)."""
    task: TaskSpec = Field(default_factory=TaskSpec)
    """Prompts and reference answers."""
    reward: RewardSpec = Field(default_factory=RewardSpec)
    """Reward function."""
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    """RL algorithm hyper-parameters."""
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec)
    """Overlap of generation and training."""
    generators: GeneratorsSpec = Field(default_factory=GeneratorsSpec)
    """Generator pools."""
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    """Trainer."""
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Checkpointing."""
    security: SecuritySpec = Field(default_factory=SecuritySpec)
    """gRPC authentication (off by default: local runs use loopback only)."""
    ranker: RankerSpec = Field(default_factory=RankerSpec)
    """Output-length ranker."""
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """Elastic scaling of generator pools."""
    image: str | None = Field(default=None, max_length=512)
    """Kubernetes: container image of every role (default: the operator's, set by the Helm chart)."""
    suspend: StrictBool = False
    """Kubernetes: scale every role to zero and keep the job (set back to false to resume)."""

    @model_validator(mode="after")
    def _remote_pools_reach_the_trainer(self) -> RLJobSpec:
        if any(p.cluster_ref for p in self.generators.pools) and self.trainer.service_type == "ClusterIP":
            raise ValueError("pools in another cluster (clusterRef) need trainer.serviceType NodePort or LoadBalancer")
        return self

    @model_validator(mode="after")
    def _exposed_trainer_needs_tls(self) -> RLJobSpec:
        if self.trainer.service_type != "ClusterIP" and self.security.tls is None:
            raise ValueError(f"trainer.serviceType {self.trainer.service_type} puts the trainer's gRPC port outside "
                             "the cluster: security.tls is required (weights and prompts would travel in clear)")
        return self

    @model_validator(mode="after")
    def _colocated_is_one_process(self) -> RLJobSpec:
        if self.pipeline.mode == "colocated" and self.trainer.world_size > 1:
            raise ValueError("pipeline.mode colocated runs generation and training in one process: "
                             "trainer.nodes and trainer.processesPerNode must be 1")
        return self


NAME_MAX = 49
"""The longest job name every child's name fits: `<name>-trainer-ranks`, a Service, must be a
DNS-1035 label of at most 63 characters."""
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_RULE = (f"must be a DNS-1035 label of at most {NAME_MAX} characters (lower-case letters, digits and '-', "
             "starting with a letter, ending with a letter or digit): the operator names the job's Services "
             f"<name>-trainer-ranks, which Kubernetes allows up to 63 characters")


class ObjectMeta(BaseModel):
    """The subset of Kubernetes metadata a local run uses; other keys are kept."""

    model_config = ConfigDict(frozen=True, extra="allow")
    name: str = "rljob"
    """Job name: a DNS-1035 label of at most 49 characters, so every object named after it
    (`<name>-trainer-ranks` the longest) is a valid Kubernetes name."""

    @field_validator("name")
    @classmethod
    def _name_makes_every_child(cls, value: str) -> str:
        if len(value) > NAME_MAX or not re.match(NAME_PATTERN, value):
            raise ValueError(f"{value!r} {NAME_RULE}")
        return value

    @property
    def labels(self) -> dict[str, str]:
        """The resource's labels (Kubernetes; e.g. Kueue's queue name), {} when it has none."""
        return dict((self.model_extra or {}).get("labels") or {})


class RLJob(SpecModel):
    """An RLJob resource as written in a YAML file or stored in Kubernetes."""

    api_version: Literal["streamrl.io/v1alpha1"] = Field(default="streamrl.io/v1alpha1", alias="apiVersion")
    """Must be streamrl.io/v1alpha1 (API_VERSION, written out: a Literal takes no variable)."""
    kind: Literal["RLJob"] = "RLJob"
    """Must be RLJob."""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    """Kubernetes object metadata."""
    spec: RLJobSpec
    """The job (required)."""
    status: dict[str, Any] | None = None
    """Written by the operator; ignored by local runs."""


_REQUIRED_WHY = {
    "spec": ": an RLJob must have a spec (at least `spec: {model: {source: builtin-tiny}}`)",
    "spec.model": ": a job must say what it trains (e.g. `model: {source: builtin-tiny}`)",
}
"""Why a required field is required, where the bare word would leave a user guessing."""


def field_path(loc: tuple[str | int, ...]) -> str:
    """A location as Kubernetes writes it: `spec.generators.pools[0].name`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or "<root>"


_ENGINE_TAGS = ("torch", "vllm", "TorchEngineSpec", "VllmEngineSpec")


def _problems(err: ValidationError) -> tuple[tuple[str, str], ...]:
    out = []
    for e in err.errors():
        loc = [p for p in e["loc"] if not str(p).startswith("function-after")]
        # A discriminated union's tag (the engine's `torch` or `vllm`) is pydantic's, not a field.
        loc = [p for i, p in enumerate(loc) if not (i and loc[i - 1] == "engine" and p in _ENGINE_TAGS)]
        where = field_path(tuple(loc))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required" + _REQUIRED_WHY.get(where, "")
        out.append((where, msg))
    return tuple(out)


def _format_errors(problems: tuple[tuple[str, str], ...], source: str) -> str:
    lines = [f"{source}: invalid RLJob ({len(problems)} problem{'s' if len(problems) > 1 else ''})"]
    lines += [f"  {where}: {msg}" for where, msg in problems]
    return "\n".join(lines)


def parse_job(data: Any, source: str = "<spec>") -> RLJob:
    """Validate a decoded RLJob document; raise SpecError naming every bad field."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: an RLJob must be a mapping, got {type(data).__name__}")
    try:
        return RLJob.model_validate(data)
    except ValidationError as err:
        problems = _problems(err)
        raise SpecError(_format_errors(problems, source), problems) from None


def load_job(path: str | Path) -> RLJob:
    """Read and validate an RLJob YAML (or JSON) file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise SpecError(f"{path}: cannot read: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from None
    return parse_job(data, str(path))


def dump_job(job: RLJob) -> str:
    """The job as YAML with camelCase keys (what `kubectl apply` takes)."""
    return yaml.safe_dump(job.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)
