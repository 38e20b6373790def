"""The rollout's run totals, one plain dataclass the run summary reads at the end. A sink, when
given one, is told of each count as it happens (the trainer's Prometheus counters: the core
knows no metrics library)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Protocol

from streamrl.rollout.refusals import MALFORMED, Refusal


class CounterSink(Protocol):
    """Where each count also goes as it grows."""

    def add(self, count: str, n: int) -> None:
        """The count named `count` (a RolloutCounters field) grew by n."""

    def refused(self, reason: Refusal, n: int) -> None:
        """n more refusals of one reason (also counted under their count: add)."""


@dataclass
class RolloutCounters:
    num_prompts_dispatched: int = 0
    """Assignments sent (a prompt re-issued after a replica left counts again)."""
    num_samples_accepted: int = 0
    num_samples_duplicate_dropped: int = 0
    num_samples_redispatched: int = 0
    num_samples_rejected: int = 0
    """Malformed samples (refusals.MALFORMED reasons); those of a prompt in flight are re-issued."""
    num_samples_stale_dropped: int = 0
    num_samples_reward_failed: int = 0
    """Samples the reward function raised on, scored 0 (reward.onError zero)."""
    num_samples_previous_incarnation: int = 0
    """Samples of work an earlier start of the trainer handed out, dropped (a resumed trainer
    issues those prompts again)."""
    num_samples_refused: dict[str, int] = field(default_factory=dict)
    """Refused samples and Connect messages by reason (refusals.Refusal values); the three
    counts above are parts of it, kept for the run summary's readers."""
    sink: CounterSink | None = field(default=None, repr=False, compare=False)
    """Told of every count as it grows (not a count)."""

    def _add(self, count: str, n: int) -> None:
        setattr(self, count, getattr(self, count) + n)
        if self.sink is not None:
            self.sink.add(count, n)

    def dispatched(self) -> None:
        self._add("num_prompts_dispatched", 1)

    def accepted(self) -> None:
        self._add("num_samples_accepted", 1)

    def redispatched(self, n: int) -> None:
        self._add("num_samples_redispatched", n)

    def refused(self, reason: Refusal, n: int = 1) -> int:
        """Count n refusals of one reason; returns that reason's total so far."""
        total = self.num_samples_refused[reason.value] = self.num_samples_refused.get(reason.value, 0) + n
        if self.sink is not None:
            self.sink.refused(reason, n)
        if reason is Refusal.DUPLICATE:
            self._add("num_samples_duplicate_dropped", n)
        elif reason is Refusal.STALE:
            self._add("num_samples_stale_dropped", n)
        elif reason is Refusal.PREVIOUS_INCARNATION:
            self._add("num_samples_previous_incarnation", n)
        elif reason in MALFORMED:
            self._add("num_samples_rejected", n)
        return total

    def reward_failed(self) -> None:
        self._add("num_samples_reward_failed", 1)

    def restore(self, saved: dict[str, int | dict[str, int]], accepted_trained: int) -> None:
        """Continue a resumed run's counts (the sink is not told: it counts this start's).
        Accepted samples count those of the iterations trained (a checkpoint can be taken with
        the next iterations' samples already in: they are generated and accepted again)."""
        for name, value in saved.items():
            if name in self.totals():
                setattr(self, name, value)
        self.num_samples_accepted = accepted_trained

    def totals(self) -> dict[str, int | dict[str, int]]:
        """Every count by name (the run summary's fields)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sink"}
