"""In-process types of the data flow: a finished sample, a scored sample and a scored group,
GRPO advantages, and how the learner cuts samples into micro-batches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Sample:
    prompt_id: str
    """Id of the prompt within the run (unique per dispatch of a dataset prompt)."""
    sample_index: int
    """Index in the prompt's group, [0, group_size)."""
    completion_token_ids: tuple[int, ...]
    """[C] generated ids (EOS included when produced)."""
    logprobs: tuple[float, ...]
    """[C] behaviour-policy log-probs of those ids at the sampling temperature."""
    policy_version: int
    """Weight version that generated the sample."""
    finish_reason: str
    """"stop" or "length"."""
    generator_id: str = ""
    """Replica that produced it."""
    queue_s: float = 0.0
    """Seconds waiting in the replica before decoding started."""
    generate_s: float = 0.0
    """Seconds of decoding."""
    incarnation: int = 0
    """The trainer incarnation whose work it answers (Work.incarnation)."""


@dataclass(frozen=True)
class ScoredSample:
    sample: Sample
    reward: float
    """Reward of the completion against the prompt's answer."""
    advantage: float
    """Group-normalised advantage."""


@dataclass(frozen=True)
class Group:
    """All samples of one prompt, scored, ready for the learner."""

    prompt_id: str
    iteration: int
    dataset_index: int
    """The prompt's index in the dataset."""
    prompt_token_ids: tuple[int, ...]
    """[P] prompt ids, BOS included."""
    samples: tuple[ScoredSample, ...]
    """Ordered by sample_index."""

    @property
    def num_samples(self) -> int:
        return len(self.samples)


def group_advantages(rewards: list[float], scale: bool = True, eps: float = 1e-6) -> list[float]:
    """GRPO advantages: reward minus the group mean, divided by the group's sample
    standard deviation (Bessel-corrected, as in TRL) when `scale`."""
    n = len(rewards)
    mean = sum(rewards) / n
    centred = [r - mean for r in rewards]
    if not scale:
        return centred
    std = (sum(c * c for c in centred) / (n - 1)) ** 0.5 if n > 1 else 0.0
    return [c / (std + eps) for c in centred]


def micro_batches_by_length(items: list[T], length: Callable[[T], int], size: int) -> list[list[T]]:
    """Items sorted by length (prompt plus completion tokens), cut into micro-batches of `size`:
    each micro-batch is padded to its longest, and output lengths are long-tailed, so one long
    sample among short ones would pad a whole micro-batch. The learner groups its share so; the
    simulator prices the same padding."""
    ordered = sorted(items, key=length)
    return [ordered[k:k + size] for k in range(0, len(ordered), size)]
