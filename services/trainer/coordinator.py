"""The rollout coordinator: the rollout core's Fleet (streamrl/rollout/fleet.py: membership and
draining, groups, dispatch, long-tail routing, the weight relay) on the trainer's event loop,
with sample intake and scoring (groups.py), streams ended on release, the replicas' metrics and
joins, the rollout's counts exported to Prometheus. Single-threaded: no locks. Knows no gRPC:
replicas' outboxes carry domain messages and the servicer converts them.

Every sample is keyed by (prompt_id, sample_index), checked (refusals.py) and accepted at most
once; a vanished replica's unfinished samples go back to the queue and out to another replica.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from streamrl.messages import Draining, Hello, LoadReport, WeightsLoaded, WeightsNotice
from streamrl.metrics import ServiceMetrics
from streamrl.records import GeneratorJoin, GeneratorStatus
from streamrl.rollout.counters import RolloutCounters
from streamrl.rollout.fleet import Fleet
from streamrl.rollout.longtail import LatencyProfile, LongTailDemand, LongTailPlan
from streamrl.rollout.refusals import (
    MALFORMED,
    MAX_MALFORMED_IN_A_ROW,
    Refusal,
    Refused,
    SampleRules,
    check_latency_profile,
    check_load_report,
    check_weights_loaded,
)
from streamrl.rollout.relay import VersionSync, WeightRelay
from streamrl.rollout.replica import Replica
from streamrl.rollout.work import GroupBook, SamplingConfig
from streamrl.rollout.workqueue import WorkQueue
from streamrl.samples import Group, Sample
from streamrl.spec import DispatchSpec
from streamrl.trainer.groups import GroupAssembler, Outcome, Scorer

log = logging.getLogger(__name__)


class PrometheusCounts:
    """The rollout's counts into the trainer's Prometheus counters as they grow (RolloutCounters' sink)."""

    def __init__(self, metrics: ServiceMetrics):
        self._counters = {"num_samples_accepted": metrics.samples_accepted,
                          "num_samples_redispatched": metrics.samples_redispatched,
                          "num_samples_duplicate_dropped": metrics.samples_duplicate,
                          "num_samples_stale_dropped": metrics.samples_stale}
        self._refused = metrics.samples_refused
        for reason in Refusal:  # every reason exported from the start, at 0
            self._refused.labels(reason.value)

    def add(self, count: str, n: int) -> None:
        if (counter := self._counters.get(count)) is not None:
            counter.inc(n)

    def refused(self, reason: Refusal, n: int) -> None:
        self._refused.labels(reason.value).inc(n)


class Coordinator(Fleet[tuple[Sample, float]]):
    def __init__(self, sampling: SamplingConfig, scorer: Scorer, metrics: ServiceMetrics,
                 scale_advantages: bool = True, queue_factor: float = 4.0, relay_pools: frozenset[str] = frozenset(),
                 on_reward_error: str = "fail", vocab_size: int | None = None, dispatch: DispatchSpec | None = None,
                 demand: Callable[[], LongTailDemand | None] = lambda: None):
        self.metrics = metrics
        self.counters = RolloutCounters(sink=PrometheusCounts(metrics))
        super().__init__(WorkQueue(sampling, self.counters, queue_factor), WeightRelay(relay_pools),
                         GroupBook(sampling.seed), dispatch, demand)
        rules = SampleRules(sampling.max_new_tokens, vocab_size, sampling.incarnation)
        self.groups = GroupAssembler(self.book, scorer, self.counters, scale_advantages, on_reward_error, rules)
        self.groups.requeue = self.requeue
        self._change = asyncio.Event()
        self._pools_seen: set[str] = set()
        self._departed_skewness_s = 0.0
        self.joins: list[GeneratorJoin] = []
        """Every replica's time to join, in order (departed ones included)."""
        self._barrier_since: float | None = time.monotonic()
        """Since when no work is pending or out (None: some is)."""

    # ---- membership -------------------------------------------------------------------
    def connect(self, hello: Hello) -> Replica:
        """A replica joins; ValueError for a bad Hello, KeyError when its id is taken."""
        if not hello.generator_id:
            raise ValueError("hello.generator_id must not be empty")
        if hello.capacity < 1:
            raise ValueError(f"hello.capacity must be >= 1, got {hello.capacity}")
        if (why := check_latency_profile(hello.latency_profile)) is not None:
            raise ValueError(f"hello.{why}")
        if hello.generator_id in self.replicas:
            raise KeyError(f"generator {hello.generator_id!r} is connected already")
        replica = Replica.of(hello, outbox=asyncio.Queue(), hello_unix=time.time())
        self.join(replica)
        self._count_replicas()
        log.info("generator %s joined (pool %s, capacity %d)", replica.generator_id, replica.pool, replica.capacity)
        self._change.set()
        return replica

    def disconnect(self, generator_id: str) -> None:
        """A replica's stream ended: what it had not delivered goes back to the queue (first in
        line, handed out as it leaves)."""
        replica = self.replicas.get(generator_id)
        if replica is None:
            return
        lost: dict[str, list[int]] = {}
        for prompt_id, i in replica.outstanding:
            task = self.book.get(prompt_id)
            if task is not None and i not in task.received:
                lost.setdefault(prompt_id, []).append(i)
        for prompt_id, indices in lost.items():
            task = self.book.get(prompt_id)
            assert task is not None  # in flight: looked up just above
            self.queue.requeue(task, indices)
            self.counters.redispatched(len(indices))
        self.leave(generator_id)
        self._count_replicas()
        self._departed_skewness_s += replica.skewness_seconds()
        num_lost = sum(map(len, lost.values()))
        (log.info if replica.draining and not num_lost else log.warning)(
            "generator %s left; %d unfinished samples go back to the queue", generator_id, num_lost)

    def released(self, replica: Replica) -> None:
        """A draining replica holds nothing more: end its stream (it exits; the stream's end disconnects it)."""
        replica.close()

    async def wait_for_generators(self, num: int = 1) -> None:
        """Return once at least `num` replicas are connected."""
        while len(self.replicas) < num:
            self._change.clear()
            await self._change.wait()

    def _count_replicas(self) -> None:
        self.metrics.connected_generators.set(len(self.replicas))
        self._pools_seen |= {r.pool for r in self.replicas.values()}
        for pool in self._pools_seen:
            self.metrics.pool_replicas.labels(pool).set(sum(r.pool == pool for r in self.replicas.values()))

    def replan(self) -> LongTailPlan | None:
        plan = super().replan()
        if plan is not None:
            d, replicas, cap = self.demand(), self.live(), self.dispatch_spec.long_tail_batch_cap
            assert d is not None  # a plan is made for a demand
            ptl = [(r.generator_id, LatencyProfile(r.latency_profile or ((1, 1.0),))) for r in replicas]
            log.info("long-tail plan: %d of %d replicas on the long tail (estimated %.2fs; for 0..%d: %s; demand "
                     "%d x %.0f + %d x %.0f tokens; PTL ms at batch %d/full: %s)", len(plan.long_replicas),
                     len(replicas), plan.estimated_s, len(replicas), " ".join(f"{t:.2f}" for t in plan.estimates_s),
                     d.num_long_samples, d.long_length, d.num_regular_samples, d.regular_length, cap,
                     " ".join(f"{gid}={p.ptl(cap) * 1e3:.2f}/{p.ptl(r.capacity) * 1e3:.2f}"
                              for (gid, p), r in zip(ptl, replicas)))
        return plan

    # ---- what replicas say ------------------------------------------------------------
    def on_message(self, generator_id: str, msg: Sample | LoadReport | WeightsLoaded | Draining) -> None:
        """Whatever a connected replica sent after its Hello."""
        match msg:
            case Sample():
                self.on_sample(generator_id, msg)
            case WeightsLoaded():
                if (refused := check_weights_loaded(msg, self.groups.published_version)) is not None:
                    self.groups.refuse(refused, generator_id)  # ignored: the stream goes on
                    return
                self.loaded(generator_id, msg)
            case LoadReport():
                if (refused := check_load_report(msg)) is not None:
                    self.groups.refuse(refused, generator_id)
                    return
                replica = self.replicas.get(generator_id)
                if replica is not None:
                    replica.load = msg
                    replica.latency_profile = msg.latency_profile or replica.latency_profile
            case Draining():
                if (replica := self.drain(generator_id)) is not None:
                    log.info("generator %s is draining (%s) with %d samples to finish", generator_id,
                             msg.reason or "no reason", len(replica.outstanding))
            case _:
                raise ValueError(f"unexpected message from generator {generator_id}: {type(msg).__name__}")

    def on_sample(self, generator_id: str, sample: Sample) -> bool:
        """Take a finished sample; False when it was not accepted: refused (intake.py says why;
        a refused sample its sender held is generated again when it must be, one it did not
        hold is only counted) or unscored (then the run fails and the sample stays
        outstanding). Raises ValueError once the sender's last MAX_MALFORMED_IN_A_ROW samples
        were all malformed: a broken generator, whose stream then ends."""
        result = self.groups.receive(sample)
        if result is Outcome.UNSCORED:
            return False
        key = (sample.prompt_id, sample.sample_index)
        replica = self.replicas.get(generator_id)
        # A sample of an earlier incarnation answers none of this one's work, even under the same key.
        held = replica is not None and key in replica.outstanding and not (
            isinstance(result, Refused) and result.reason is Refusal.PREVIOUS_INCARNATION)
        if held and replica is not None:
            replica.outstanding.discard(key)
        if replica is not None:
            if result is Outcome.ACCEPTED:
                replica.num_samples += 1
                replica.malformed_in_a_row = 0
                if replica.num_samples == 1:
                    self._joined(replica)
            self.release_if_drained(replica)
        if isinstance(result, Refused) and result.reissue and held:
            task = self.book.get(sample.prompt_id)
            assert task is not None  # a refusal that reissues is of a prompt in flight
            self.queue.requeue(task, [sample.sample_index])
        self.dispatch()
        if replica is not None and isinstance(result, Refused) and result.reason in MALFORMED:
            replica.malformed_in_a_row += 1
            if replica.malformed_in_a_row >= MAX_MALFORMED_IN_A_ROW:
                raise ValueError(f"generator {generator_id} sent {replica.malformed_in_a_row} malformed samples "
                                 f"in a row, the last {result.reason.value}: {result.detail}")
        return result is Outcome.ACCEPTED

    def refuse_message(self, generator_id: str, refused: Refused) -> None:
        """A Connect message refused at the stream's edge (not a sample): counted like samples."""
        self.groups.refuse(refused, generator_id)

    def set_vocab_size(self, vocab_size: int) -> None:
        """The trainer model's vocabulary: a sample holding a token id outside it is refused."""
        self.groups.rules = replace(self.groups.rules, vocab_size=vocab_size)

    @property
    def rules(self) -> SampleRules:
        return self.groups.rules

    def _joined(self, replica: Replica) -> None:
        """Its first accepted sample: how long it took from its process's start."""
        if not replica.started_unix:
            return
        replica.join_s = time.time() - replica.started_unix
        self.metrics.generator_join_seconds.observe(replica.join_s)
        self.joins.append(GeneratorJoin(generator_id=replica.generator_id, pool=replica.pool,
                                        startup_s=round(replica.hello_unix - replica.started_unix, 3),
                                        join_s=round(replica.join_s, 3)))
        log.info("generator %s joined: first sample %.1fs after its process started (Hello after %.1fs)",
                 replica.generator_id, replica.join_s, replica.hello_unix - replica.started_unix)

    # ---- work -------------------------------------------------------------------------
    def at_barrier(self, barrier: bool) -> None:
        """Account the seconds at the generation barrier (Fleet.barrier): not spare capacity."""
        now = time.monotonic()
        if self._barrier_since is not None:
            self.metrics.generation_barrier_seconds.inc(now - self._barrier_since)
        self._barrier_since = now if barrier else None

    async def take_groups(self, iteration: int, min_samples: int, max_samples: int,
                          min_policy_version: int = 0) -> list[Group]:
        """Complete groups of `iteration` (see GroupAssembler.take)."""
        return await self.groups.take(iteration, min_samples, max_samples, min_policy_version)

    # ---- weights ----------------------------------------------------------------------
    def announce(self, notice: WeightsNotice) -> None:
        self.groups.published_version = max(self.groups.published_version, notice.policy_version)
        super().announce(notice)

    def version_sync(self, policy_version: int) -> VersionSync:
        return self.relay.version_sync(policy_version)

    # ---- reporting --------------------------------------------------------------------
    def skewness_bubble_seconds(self) -> float:
        """Skewness-bubble seconds of every replica so far (as last reported; departed ones included)."""
        return self._departed_skewness_s + sum(r.skewness_seconds() for r in self.replicas.values())

    def status(self) -> dict:
        """The rollout's part of the trainer's /status (TrainerStatus fields)."""
        return {
            "generators": {
                r.generator_id: GeneratorStatus(
                    pool=r.pool, capacity=r.capacity, outstanding=len(r.outstanding),
                    policy_version=r.policy_version, num_samples=r.num_samples,
                    tokens_per_s=round(r.load.tokens_per_s, 1) if r.load else None,
                    weights_address=r.weights_address, latency_profile=list(r.latency_profile),
                    join_s=round(r.join_s, 3) if r.join_s is not None else None)
                for r in self.replicas.values()
            },
            "generator_joins": list(self.joins),
            "num_prompts_inflight": self.book.num_inflight,
            "num_samples_pending": self.queue.num_samples_pending,
            "num_groups_ready": self.book.num_groups_ready,
        }

    def close(self) -> None:
        """End every replica's stream (the run is over)."""
        for replica in self.replicas.values():
            replica.close()
