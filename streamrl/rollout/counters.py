"""The rollout's run totals, one dataclass: each count also feeds its Prometheus counter, and
the run summary reads them all at the end."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from streamrl.metrics import ServiceMetrics
from streamrl.rollout.refusals import MALFORMED, Refusal


@dataclass
class RolloutCounters:
    metrics: ServiceMetrics = field(repr=False)
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

    def __post_init__(self) -> None:
        for reason in Refusal:  # every reason exported from the start, at 0
            self.metrics.samples_refused.labels(reason.value)

    def dispatched(self) -> None:
        self.num_prompts_dispatched += 1

    def accepted(self) -> None:
        self.num_samples_accepted += 1
        self.metrics.samples_accepted.inc()

    def redispatched(self, n: int) -> None:
        self.num_samples_redispatched += n
        self.metrics.samples_redispatched.inc(n)

    def refused(self, reason: Refusal, n: int = 1) -> int:
        """Count n refusals of one reason; returns that reason's total so far."""
        total = self.num_samples_refused[reason.value] = self.num_samples_refused.get(reason.value, 0) + n
        self.metrics.samples_refused.labels(reason.value).inc(n)
        if reason is Refusal.DUPLICATE:
            self.num_samples_duplicate_dropped += n
            self.metrics.samples_duplicate.inc(n)
        elif reason is Refusal.STALE:
            self.num_samples_stale_dropped += n
            self.metrics.samples_stale.inc(n)
        elif reason is Refusal.PREVIOUS_INCARNATION:
            self.num_samples_previous_incarnation += n
        elif reason in MALFORMED:
            self.num_samples_rejected += n
        return total

    def reward_failed(self) -> None:
        self.num_samples_reward_failed += 1

    def restore(self, saved: dict[str, int], accepted_trained: int) -> None:
        """Continue a resumed run's counts. Accepted samples count those of the iterations
        trained (a checkpoint can be taken with the next iterations' samples already in: they
        are generated and accepted again)."""
        for name, value in saved.items():
            if name in self.totals():
                setattr(self, name, value)
        self.num_samples_accepted = accepted_trained

    def totals(self) -> dict[str, int | dict[str, int]]:
        """Every count by name (the run summary's fields)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "metrics"}
