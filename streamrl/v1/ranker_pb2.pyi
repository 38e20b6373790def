from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RankedPrompt(_message.Message):
    __slots__ = ("prompt_key", "text")
    PROMPT_KEY_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    prompt_key: str
    text: str
    def __init__(self, prompt_key: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class RankRequest(_message.Message):
    __slots__ = ("prompts",)
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[RankedPrompt]
    def __init__(self, prompts: _Optional[_Iterable[_Union[RankedPrompt, _Mapping]]] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("predicted_length", "rank")
    PREDICTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    predicted_length: float
    rank: int
    def __init__(self, predicted_length: _Optional[float] = ..., rank: _Optional[int] = ...) -> None: ...

class RankResponse(_message.Message):
    __slots__ = ("predictions",)
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    predictions: _containers.RepeatedCompositeFieldContainer[Prediction]
    def __init__(self, predictions: _Optional[_Iterable[_Union[Prediction, _Mapping]]] = ...) -> None: ...

class ObserveRequest(_message.Message):
    __slots__ = ("prompt", "policy_version", "lengths")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    prompt: RankedPrompt
    policy_version: int
    lengths: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt: _Optional[_Union[RankedPrompt, _Mapping]] = ..., policy_version: _Optional[int] = ..., lengths: _Optional[_Iterable[int]] = ...) -> None: ...

class ObserveResponse(_message.Message):
    __slots__ = ("num_observed",)
    NUM_OBSERVED_FIELD_NUMBER: _ClassVar[int]
    num_observed: int
    def __init__(self, num_observed: _Optional[int] = ...) -> None: ...
