"""The RLJob spec: one typed model read by `streamrl run`, every service, `streamrl validate`
and the operator (the CRD is generated from it). Imports neither torch nor grpc. Field names
are camelCase on the wire (Kubernetes style).

One module per part of the job: `training` (model, task, reward, algorithm, pipeline,
checkpoints), `generators`, `services` (trainer, ranker), `security`, `autoscaling`, and `job`
(the resource itself, reading and writing job files, errors); everything is importable from
here.
"""

from streamrl.spec.autoscaling import (
    AutoscalingSpec,
    ScalingBehaviorSpec,
    ScalingPolicySpec,
    ScalingRulesSpec,
)
from streamrl.spec.base import SpecModel
from streamrl.spec.generators import (
    DispatchSpec,
    EngineSpec,
    GeneratorPoolSpec,
    GeneratorsSpec,
    PlacementSpec,
    ReconnectSpec,
    TorchEngineSpec,
    VllmEngineSpec,
)
from streamrl.spec.job import (
    API_VERSION,
    GROUP,
    KIND,
    VERSION,
    ObjectMeta,
    RLJob,
    RLJobSpec,
    SpecError,
    dump_job,
    field_path,
    load_job,
    parse_job,
)
from streamrl.spec.security import TLS_MOUNT, TOKEN_MOUNT, SecuritySpec, TLSSpec
from streamrl.spec.services import RankerSpec, TrainerMemorySpec, TrainerServiceSpec, TrainerSpec, TrainerStartupSpec
from streamrl.spec.training import (
    AlgorithmSpec,
    CheckpointSpec,
    CheckpointVolumeSpec,
    ModelSpec,
    PipelineMode,
    PipelineSpec,
    RewardSpec,
    TaskName,
    TaskSpec,
)

__all__ = [
    "API_VERSION", "GROUP", "KIND", "TLS_MOUNT", "TOKEN_MOUNT", "VERSION", "AlgorithmSpec", "AutoscalingSpec",
    "CheckpointSpec",
    "CheckpointVolumeSpec", "DispatchSpec", "EngineSpec", "GeneratorPoolSpec", "GeneratorsSpec", "ModelSpec",
    "ObjectMeta", "PipelineMode", "PipelineSpec", "PlacementSpec", "RLJob", "ReconnectSpec", "RLJobSpec",
    "RankerSpec", "RewardSpec", "ScalingBehaviorSpec", "ScalingPolicySpec", "ScalingRulesSpec", "SecuritySpec",
    "SpecError", "SpecModel", "TLSSpec", "TaskName", "TaskSpec", "TorchEngineSpec", "TrainerMemorySpec",
    "TrainerServiceSpec", "TrainerSpec", "TrainerStartupSpec", "VllmEngineSpec", "dump_job",
    "field_path", "load_job", "parse_job",
]
