"""Sample intake and group assembly: prompts in flight, each finished sample checked
(streamrl/rollout/refusals.py decides) and scored on arrival (before any bookkeeping changes, so a sample that
cannot be scored is neither lost nor counted), complete groups handed to the learner by
iteration, samples older than the staleness contract dropped and re-issued at consumption."""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import deque
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
from streamrl.rollout.work import InFlight, PromptWork, take_complete
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
    def __init__(self, scorer: Scorer, counters: RolloutCounters, scale_advantages: bool = True,
                 on_reward_error: str = "fail", seed: int = 0, rules: SampleRules | None = None):
        self.scorer = scorer
        self.counters = counters
        self.rules = rules or SampleRules(max_new_tokens=1 << 30)
        """What every sample must satisfy (the job's and the model's limits)."""
        self.published_version = 0
        """The newest weight version announced to generators; no sample is of a later one."""
        self.scale_advantages = scale_advantages
        self.on_reward_error = on_reward_error
        self.seed = seed
        """The run's sampling seed; each prompt derives its own from it."""
        self.requeue: Callable[[InFlight, list[int]], None] = lambda task, indices: None
        """Called with samples to generate again (stale, malformed)."""
        self.failure: RewardError | None = None
        """Why the run must stop (raised to whoever waits for groups)."""
        self._inflight: dict[str, InFlight] = {}
        self._finished: set[str] = set()  # prompt ids whose group completed (late copies are duplicates)
        self._ready: dict[int, deque[InFlight]] = {}  # iteration -> complete, not yet consumed
        self._ready_event = asyncio.Event()

    def open(self, iteration: int, prompts: list[PromptWork], group_size: int,
             min_policy_version: int) -> list[InFlight]:
        tasks = []
        for p in prompts:
            seed = (self.seed << 32) + zlib.crc32(p.prompt_id.encode())
            task = self._inflight[p.prompt_id] = InFlight(p, iteration, group_size, seed, min_policy_version)
            tasks.append(task)
        return tasks

    def get(self, prompt_id: str) -> InFlight | None:
        return self._inflight.get(prompt_id)

    def receive(self, sample: Sample) -> Outcome | Refused:
        """Check and score a sample; only an ACCEPTED one changes the group. A refused one is
        counted by its reason and changes nothing (the caller re-issues it if `reissue`)."""
        task = self._inflight.get(sample.prompt_id)
        refused = check_sample(sample, task, sample.prompt_id in self._finished, self.rules, self.published_version)
        if refused is not None:
            self.refuse(refused, sample.generator_id)
            return refused
        try:
            reward = self.scorer(sample, task.prompt.answer)
        except RewardError as err:
            if self.on_reward_error != "zero":
                self.fail(err)
                return Outcome.UNSCORED
            log.warning("%s; scored 0 (reward.onError zero)", err)
            self.counters.reward_failed()
            reward = 0.0
        task.received[sample.sample_index] = (sample, reward)
        self.counters.accepted()
        if len(task.received) == task.group_size:
            del self._inflight[task.prompt_id]
            self._finished.add(task.prompt_id)
            self._ready.setdefault(task.iteration, deque()).append(task)
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
        ordered = [task.received[i] for i in range(task.group_size)]
        advantages = group_advantages([r for _, r in ordered], self.scale_advantages)
        scored = tuple(ScoredSample(s, r, a) for (s, r), a in zip(ordered, advantages))
        p = task.prompt
        return Group(p.prompt_id, task.iteration, p.dataset_index, p.token_ids, scored)

    def _drop_stale(self, task: InFlight, min_policy_version: int) -> bool:
        """Re-issue the samples older than min_policy_version; True when any were."""
        stale = sorted(i for i, (s, _) in task.received.items() if s.policy_version < min_policy_version)
        if not stale:
            return False
        for i in stale:
            del task.received[i]
        task.min_policy_version = max(task.min_policy_version, min_policy_version)
        self._inflight[task.prompt_id] = task
        self._finished.discard(task.prompt_id)
        self.refuse(Refused(Refusal.STALE, f"{len(stale)} samples of {task.prompt_id} are older than "
                                           f"v{min_policy_version} at consumption; re-issued"), "", len(stale))
        self.requeue(task, stale)
        return True

    def _ready_samples(self, iteration: int) -> int:
        return sum(t.group_size for t in self._ready.get(iteration, ()))

    async def take(self, iteration: int, min_samples: int, max_samples: int,
                   min_policy_version: int = 0) -> list[Group]:
        """Wait until complete groups of `iteration` hold at least min_samples samples;
        return groups (at least one) holding at most max_samples unless a single group is
        larger. Samples older than min_policy_version are dropped and re-issued instead.
        Raises the RewardError that stopped the run."""
        while True:
            while self._ready_samples(iteration) < min_samples and self.failure is None:
                self._ready_event.clear()
                await self._ready_event.wait()
            if self.failure is not None:
                raise self.failure
            queue = self._ready[iteration]
            taken = take_complete(queue, max_samples, lambda t: t.group_size,
                                  keep=lambda t: not self._drop_stale(t, min_policy_version))
            if not queue:
                del self._ready[iteration]
            if taken:
                return [self._score(t) for t in taken]

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    @property
    def num_groups_ready(self) -> int:
        return sum(len(q) for q in self._ready.values())
