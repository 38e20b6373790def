"""The rollout's run totals, one dataclass: each count also feeds its Prometheus counter, and
the run summary reads them all at the end."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from streamrl.metrics import ServiceMetrics


@dataclass
class RolloutCounters:
    metrics: ServiceMetrics = field(repr=False)
    num_prompts_dispatched: int = 0
    """Assignments sent (a prompt re-issued after a replica left counts again)."""
    num_samples_accepted: int = 0
    num_samples_duplicate_dropped: int = 0
    num_samples_redispatched: int = 0
    num_samples_rejected: int = 0
    """Malformed samples (index out of range, log-probs not matching tokens); re-issued."""
    num_samples_stale_dropped: int = 0
    num_samples_reward_failed: int = 0
    """Samples the reward function raised on, scored 0 (reward.onError zero)."""
    num_samples_previous_incarnation: int = 0
    """Samples of work an earlier start of the trainer handed out, dropped (a resumed trainer
    issues those prompts again)."""

    def dispatched(self) -> None:
        self.num_prompts_dispatched += 1

    def accepted(self) -> None:
        self.num_samples_accepted += 1
        self.metrics.samples_accepted.inc()

    def duplicate(self) -> None:
        self.num_samples_duplicate_dropped += 1
        self.metrics.samples_duplicate.inc()

    def redispatched(self, n: int) -> None:
        self.num_samples_redispatched += n
        self.metrics.samples_redispatched.inc(n)

    def rejected(self) -> None:
        self.num_samples_rejected += 1

    def stale(self, n: int) -> None:
        self.num_samples_stale_dropped += n
        self.metrics.samples_stale.inc(n)

    def previous_incarnation(self) -> None:
        self.num_samples_previous_incarnation += 1

    def reward_failed(self) -> None:
        self.num_samples_reward_failed += 1

    def totals(self) -> dict[str, int]:
        """Every count by name (the run summary's fields)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "metrics"}
