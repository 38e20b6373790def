from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason

class ConnectRequest(_message.Message):
    __slots__ = ("hello", "sample", "load", "weights_loaded", "draining")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_LOADED_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    sample: Sample
    load: LoadReport
    weights_loaded: WeightsLoaded
    draining: Draining
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., sample: _Optional[_Union[Sample, _Mapping]] = ..., load: _Optional[_Union[LoadReport, _Mapping]] = ..., weights_loaded: _Optional[_Union[WeightsLoaded, _Mapping]] = ..., draining: _Optional[_Union[Draining, _Mapping]] = ...) -> None: ...

class Draining(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("generator_id", "pool", "capacity", "engine", "policy_version", "weights_address", "latency_profile", "started_unix", "weights_sha256", "without_weights")
    GENERATOR_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_PROFILE_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    WITHOUT_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    generator_id: str
    pool: str
    capacity: int
    engine: str
    policy_version: int
    weights_address: str
    latency_profile: _containers.RepeatedCompositeFieldContainer[LatencyPoint]
    started_unix: float
    weights_sha256: str
    without_weights: bool
    def __init__(self, generator_id: _Optional[str] = ..., pool: _Optional[str] = ..., capacity: _Optional[int] = ..., engine: _Optional[str] = ..., policy_version: _Optional[int] = ..., weights_address: _Optional[str] = ..., latency_profile: _Optional[_Iterable[_Union[LatencyPoint, _Mapping]]] = ..., started_unix: _Optional[float] = ..., weights_sha256: _Optional[str] = ..., without_weights: _Optional[bool] = ...) -> None: ...

class LatencyPoint(_message.Message):
    __slots__ = ("batch_size", "seconds_per_step")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    seconds_per_step: float
    def __init__(self, batch_size: _Optional[int] = ..., seconds_per_step: _Optional[float] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("prompt_id", "sample_index", "completion_token_ids", "logprobs", "policy_version", "finish_reason", "queue_s", "generate_s", "incarnation", "version_runs")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    GENERATE_S_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    VERSION_RUNS_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    sample_index: int
    completion_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    policy_version: int
    finish_reason: FinishReason
    queue_s: float
    generate_s: float
    incarnation: int
    version_runs: _containers.RepeatedCompositeFieldContainer[VersionRun]
    def __init__(self, prompt_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., completion_token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., policy_version: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., queue_s: _Optional[float] = ..., generate_s: _Optional[float] = ..., incarnation: _Optional[int] = ..., version_runs: _Optional[_Iterable[_Union[VersionRun, _Mapping]]] = ...) -> None: ...

class VersionRun(_message.Message):
    __slots__ = ("policy_version", "num_tokens")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    num_tokens: int
    def __init__(self, policy_version: _Optional[int] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("num_running", "num_waiting", "num_generated_tokens", "tokens_per_s", "latency_profile", "skewness_bubble_s")
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LATENCY_PROFILE_FIELD_NUMBER: _ClassVar[int]
    SKEWNESS_BUBBLE_S_FIELD_NUMBER: _ClassVar[int]
    num_running: int
    num_waiting: int
    num_generated_tokens: int
    tokens_per_s: float
    latency_profile: _containers.RepeatedCompositeFieldContainer[LatencyPoint]
    skewness_bubble_s: float
    def __init__(self, num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_generated_tokens: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., latency_profile: _Optional[_Iterable[_Union[LatencyPoint, _Mapping]]] = ..., skewness_bubble_s: _Optional[float] = ...) -> None: ...

class WeightsLoaded(_message.Message):
    __slots__ = ("policy_version", "sync_s", "size_bytes", "source")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SYNC_S_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    sync_s: float
    size_bytes: int
    source: str
    def __init__(self, policy_version: _Optional[int] = ..., sync_s: _Optional[float] = ..., size_bytes: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("welcome", "assign", "new_weights", "configure")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    NEW_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    CONFIGURE_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    assign: Assign
    new_weights: NewWeights
    configure: Configure
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., assign: _Optional[_Union[Assign, _Mapping]] = ..., new_weights: _Optional[_Union[NewWeights, _Mapping]] = ..., configure: _Optional[_Union[Configure, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("run_id", "policy_version", "incarnation")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_version: int
    incarnation: int
    def __init__(self, run_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class Assign(_message.Message):
    __slots__ = ("prompt_id", "prompt_token_ids", "sample_indices", "sampling", "min_policy_version", "priority", "incarnation")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDICES_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MIN_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sample_indices: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    min_policy_version: int
    priority: float
    incarnation: int
    def __init__(self, prompt_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sample_indices: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., min_policy_version: _Optional[int] = ..., priority: _Optional[float] = ..., incarnation: _Optional[int] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "max_new_tokens", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., max_new_tokens: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class Configure(_message.Message):
    __slots__ = ("max_batch_size",)
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    max_batch_size: int
    def __init__(self, max_batch_size: _Optional[int] = ...) -> None: ...

class NewWeights(_message.Message):
    __slots__ = ("policy_version", "size_bytes", "num_chunks", "sha256", "source")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    size_bytes: int
    num_chunks: int
    sha256: str
    source: str
    def __init__(self, policy_version: _Optional[int] = ..., size_bytes: _Optional[int] = ..., num_chunks: _Optional[int] = ..., sha256: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class FetchWeightsRequest(_message.Message):
    __slots__ = ("policy_version", "offset_bytes")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    offset_bytes: int
    def __init__(self, policy_version: _Optional[int] = ..., offset_bytes: _Optional[int] = ...) -> None: ...

class FetchWeightsResponse(_message.Message):
    __slots__ = ("policy_version", "offset_bytes", "data", "sha256", "size_bytes")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    offset_bytes: int
    data: bytes
    sha256: str
    size_bytes: int
    def __init__(self, policy_version: _Optional[int] = ..., offset_bytes: _Optional[int] = ..., data: _Optional[bytes] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class FetchModelRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FetchModelResponse(_message.Message):
    __slots__ = ("name", "size_bytes", "sha256", "offset_bytes", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    size_bytes: int
    sha256: str
    offset_bytes: int
    data: bytes
    def __init__(self, name: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., offset_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...
