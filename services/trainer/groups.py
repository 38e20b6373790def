"""Sample intake and group assembly: each finished sample checked (streamrl/rollout/refusals.py
decides) and scored on arrival (before any bookkeeping changes, so a sample that cannot be scored
is neither lost nor counted), then added to its group in the rollout core's GroupBook; complete
groups handed to the learner by iteration with their advantages, samples older than the
staleness contract dropped and re-issued at consumption."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum, auto

from streamrl.rewards import RewardError
from streamrl.rollout.counters import RolloutCounters
from streamrl.rollout.refusals import (
    RACES,
    SAMPLE_REASONS,
    Refusal,
    Refused,
    SampleRules,
    check_sample,
    worth_logging,
)
from streamrl.rollout.work import GroupBook, InFlight
from streamrl.samples import Group, Sample, ScoredSample, group_advantages

log = logging.getLogger(__name__)

Scorer = Callable[[Sample, str], float]
"""Reward of a sample given its prompt's answer; raises RewardError when it cannot."""


class Outcome(Enum):
    """What became of a sample that arrived, when it was not refused (refusals.Refused)."""

    ACCEPTED = auto()
    UNSCORED = auto()
    """The reward function raised and reward.onError is `fail`: the run fails."""


class GroupAssembler:
    def __init__(self, book: GroupBook[tuple[Sample, float]], scorer: Scorer, counters: RolloutCounters,
                 scale_advantages: bool = True, on_reward_error: str = "fail", rules: SampleRules | None = None):
        self.book = book
        """The groups, (sample, reward) by sample index (the rollout core's)."""
        self.scorer = scorer
        self.counters = counters
        self.rules = rules or SampleRules(max_new_tokens=1 << 30)
        """What every sample must satisfy (the job's and the model's limits)."""
        self.published_version = 0
        """The newest weight version announced to generators; no sample is of a later one."""
        self.scale_advantages = scale_advantages
        self.on_reward_error = on_reward_error
        self.requeue: Callable[[InFlight, list[int]], None] = lambda task, indices: None
        """Called with samples to generate again (stale, malformed)."""
        self.failure: RewardError | None = None
        """Why the run must stop (raised to whoever waits for groups)."""
        self._ready_event = asyncio.Event()
        """Set when a group completes (or the run fails)."""

    def receive(self, sample: Sample) -> Outcome | Refused:
        """Check and score a sample; only an ACCEPTED one changes the group. A refused one is
        counted by its reason and changes nothing (the caller re-issues it if `reissue`)."""
        task = self.book.get(sample.prompt_id)
        refused = check_sample(sample, task, self.book.finished(sample.prompt_id), self.rules,
                               self.published_version)
        if refused is not None:
            self.refuse(refused, sample.generator_id)
            return refused
        assert task is not None  # check_sample refuses a sample of no prompt in flight
        try:
            reward = self.scorer(sample, task.prompt.answer)
        except RewardError as err:
            if self.on_reward_error != "zero":
                self.fail(err)
                return Outcome.UNSCORED
            log.warning("%s; scored 0 (reward.onError zero)", err)
            self.counters.reward_failed()
            reward = 0.0
        self.counters.accepted()
        if self.book.add(sample.prompt_id, sample.sample_index, (sample, reward)):
            self._ready_event.set()
        return Outcome.ACCEPTED

    def refuse(self, refused: Refused, generator_id: str, n: int = 1) -> None:
        """Count a refusal (of a sample or a Connect message) and log it while that stays readable."""
        total = self.counters.refused(refused.reason, n)
        if worth_logging(total):
            benign = refused.reason in RACES
            what = f"{n} samples" if n > 1 else "a sample" if refused.reason in SAMPLE_REASONS else "a message"
            source = f" from generator {generator_id}" if generator_id else ""
            (log.info if benign else log.warning)("refused %s%s (%s, %d so far): %s", what, source,
                                                  refused.reason.value, total, refused.detail)

    def fail(self, err: RewardError) -> None:
        """Stop handing out groups: whoever waits for them gets the error."""
        if self.failure is None:
            log.error("%s: the run stops (reward.onError fail)", err)
            self.failure = err
        self._ready_event.set()

    def _score(self, task: InFlight) -> Group:
        ordered = task.in_order()
        advantages = group_advantages([r for _, r in ordered], self.scale_advantages)
        scored = tuple(ScoredSample(s, r, a) for (s, r), a in zip(ordered, advantages))
        p = task.prompt
        return Group(p.prompt_id, task.iteration, p.dataset_index, p.token_ids, scored)

    def _drop_stale(self, task: InFlight, min_policy_version: int) -> bool:
        """Re-issue the samples older than min_policy_version; True when any were."""
        stale = sorted(i for i, (s, _) in task.received.items() if s.policy_version < min_policy_version)
        if not stale:
            return False
        self.book.reopen(task, stale, min_policy_version)
        self.refuse(Refused(Refusal.STALE, f"{len(stale)} samples of {task.prompt_id} are older than "
                                           f"v{min_policy_version} at consumption; re-issued"), "", len(stale))
        self.requeue(task, stale)
        return True

    async def take(self, iteration: int, min_samples: int, max_samples: int,
                   min_policy_version: int = 0) -> list[Group]:
        """Wait until complete groups of `iteration` hold at least min_samples samples;
        return groups (at least one) holding at most max_samples unless a single group is
        larger. Samples older than min_policy_version are dropped and re-issued instead.
        Raises the RewardError that stopped the run."""
        while True:
            while self.book.ready_samples(iteration) < min_samples and self.failure is None:
                self._ready_event.clear()
                await self._ready_event.wait()
            if self.failure is not None:
                raise self.failure
            taken = self.book.take(iteration, max_samples, keep=lambda t: not self._drop_stale(t, min_policy_version))
            if taken:
                return [self._score(t) for t in taken]
