"""Work in flight: the sampling parameters every Work message carries (SamplingConfig) and the
order an engine admits it in (admission_key); one prompt of an iteration as it is dispatched
(PromptWork), its group while samples are missing (InFlight), and the rule that takes complete
groups for the learner."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from streamrl.samples import Sample


@dataclass(frozen=True)
class SamplingConfig:
    """The sampling parameters of every Work message."""

    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    """Run seed; each prompt derives its own from it."""
    incarnation: int = 0
    """This start of the run's trainer (every Work carries it; samples echo it back)."""


def admission_key(priority: float, arrival: int) -> tuple[float, int]:
    """The order in which waiting requests join the running batch (smallest first): highest
    priority first (the longest predicted output under ranked dispatch: longest-processing-
    time first), then first come first served. Pure: the torch engine and the simulator's
    replicas both order by it."""
    return -priority, arrival


@dataclass(frozen=True)
class PromptWork:
    """One prompt of an iteration, ready to be dispatched."""

    prompt_id: str
    """Unique within the run: `<iteration>-<position>-<dataset index>`."""
    dataset_index: int
    answer: str
    token_ids: tuple[int, ...]
    """[P] prompt ids, BOS included."""
    predicted_length: float = 0.0
    """The ranker's prediction, tokens (0 = none); also the in-replica priority (longest first)."""
    long_tail: bool = False
    """Predicted to be in the long tail: served by the long-tail replicas when there are any."""


@dataclass
class InFlight:
    """A prompt whose group is not complete yet."""

    prompt: PromptWork
    iteration: int
    group_size: int
    seed: int
    """Sample i is drawn with seed + i, on whichever replica."""
    min_policy_version: int
    received: dict[int, tuple[Sample, float]] = field(default_factory=dict)
    """sample_index -> (sample, reward)."""

    @property
    def prompt_id(self) -> str:
        return self.prompt.prompt_id

    def missing(self, indices: list[int]) -> list[int]:
        return [i for i in indices if i not in self.received]


G = TypeVar("G")


def take_complete(ready: deque[G], max_samples: int, size: Callable[[G], int],
                  keep: Callable[[G], bool] = lambda _: True) -> list[G]:
    """Complete groups off the front of `ready`, in arrival order, holding at most max_samples
    samples unless the first one alone is larger (a group is never split); a group `keep`
    refuses is removed and not counted (the trainer re-issues its stale samples)."""
    out: list[G] = []
    total = 0
    while ready and (not out or total + size(ready[0]) <= max_samples):
        group = ready.popleft()
        if not keep(group):
            continue
        out.append(group)
        total += size(group)
    return out
