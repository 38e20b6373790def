"""Work in flight: the sampling parameters every Work message carries (SamplingConfig) and the
order an engine admits it in (admission_key); one prompt of an iteration as it is dispatched
(PromptWork), its group while samples are missing (InFlight), and every group of the rollout
from dispatch to consumption (GroupBook, with the rule that takes complete groups)."""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

P = TypeVar("P")
"""What a group holds per sample: (Sample, reward) in the trainer, a simulated sequence in the simulator."""


@dataclass(frozen=True)
class SamplingConfig:
    """The sampling parameters of every Work message."""

    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    """Run seed; each prompt derives its own from it (GroupBook.open)."""
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
class InFlight(Generic[P]):
    """A prompt whose group is not complete yet."""

    prompt: PromptWork
    iteration: int
    group_size: int
    seed: int
    """Sample i is drawn with seed + i, on whichever replica."""
    min_policy_version: int
    received: dict[int, P] = field(default_factory=dict)
    """sample_index -> what arrived for it, in arrival order."""

    @property
    def prompt_id(self) -> str:
        return self.prompt.prompt_id

    def missing(self, indices: list[int]) -> list[int]:
        return [i for i in indices if i not in self.received]

    def in_order(self) -> list[P]:
        """What arrived, by sample index (of a complete group: every sample)."""
        return [self.received[i] for i in sorted(self.received)]


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


class GroupBook(Generic[P]):
    """Every group of the rollout from dispatch to consumption: in flight while samples are
    missing, then ready (by iteration, in the order they completed) until taken. Knows no
    checks and no scores: whoever adds a sample has accepted it."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        """The run's sampling seed; each prompt derives its own from it."""
        self._inflight: dict[str, InFlight[P]] = {}
        self._finished: set[str] = set()
        """Prompt ids whose group completed (late copies of their samples are duplicates)."""
        self._ready: dict[int, deque[InFlight[P]]] = {}
        """Iteration -> complete groups, not yet taken."""

    def open(self, iteration: int, prompts: list[PromptWork], group_size: int,
             min_policy_version: int) -> list[InFlight[P]]:
        """These prompts' groups, in flight from now, in this order; each draws its samples
        with its own seed (the run's, and a hash of its id: the same on every replica and
        every start of the run)."""
        tasks = []
        for p in prompts:
            seed = (self.seed << 32) + zlib.crc32(p.prompt_id.encode())
            task = self._inflight[p.prompt_id] = InFlight(p, iteration, group_size, seed, min_policy_version)
            tasks.append(task)
        return tasks

    def get(self, prompt_id: str) -> InFlight[P] | None:
        """The prompt's group while it is in flight."""
        return self._inflight.get(prompt_id)

    def finished(self, prompt_id: str) -> bool:
        """Its group completed (and was not reopened since)."""
        return prompt_id in self._finished

    def add(self, prompt_id: str, sample_index: int, payload: P) -> bool:
        """An accepted sample of a group in flight; True when it completes the group (which is
        ready from now)."""
        task = self._inflight[prompt_id]
        task.received[sample_index] = payload
        if len(task.received) < task.group_size:
            return False
        del self._inflight[prompt_id]
        self._finished.add(prompt_id)
        self._ready.setdefault(task.iteration, deque()).append(task)
        return True

    def reopen(self, task: InFlight[P], indices: list[int], min_policy_version: int) -> None:
        """A group taken complete loses these samples (to be generated again, by weights no
        older than min_policy_version): it is in flight again."""
        for i in indices:
            del task.received[i]
        task.min_policy_version = max(task.min_policy_version, min_policy_version)
        self._inflight[task.prompt_id] = task
        self._finished.discard(task.prompt_id)

    def ready_samples(self, iteration: int) -> int:
        """Samples in the complete groups of `iteration` not taken yet."""
        return sum(t.group_size for t in self._ready.get(iteration, ()))

    def take(self, iteration: int, max_samples: int,
             keep: Callable[[InFlight[P]], bool] = lambda _: True) -> list[InFlight[P]]:
        """Complete groups of `iteration` in the order they completed, at most max_samples
        samples unless one group alone is larger (take_complete); a group `keep` refuses is
        dropped from the ready ones (its keeper reopens it)."""
        queue = self._ready.get(iteration)
        if queue is None:
            return []
        taken = take_complete(queue, max_samples, lambda t: t.group_size, keep)
        if not queue:
            del self._ready[iteration]
        return taken

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    @property
    def num_groups_ready(self) -> int:
        return sum(len(q) for q in self._ready.values())
