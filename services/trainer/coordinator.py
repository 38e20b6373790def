"""Rollout coordinator: connected generators, dispatch, in-flight tracking, sample intake.

Runs on the trainer's event loop (single-threaded: no locks). Knows no gRPC: it puts
domain messages in each generator's outbox and the servicer converts them. Every sample
is keyed by (prompt_id, sample_index) and accepted at most once; a vanished generator's
unfinished samples go back to the queue and out to another replica.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from streamrl.metrics import ServiceMetrics
from streamrl.records import GeneratorStatus
from streamrl.samples import Group, Sample, ScoredSample, WeightsNotice, Work, group_advantages

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    """Run seed; each prompt derives its own from it."""


@dataclass(frozen=True)
class BatchCap:
    """Tell a replica to decode at most this many sequences at once (0 = its capacity)."""

    max_batch_size: int


@dataclass
class GeneratorHandle:
    generator_id: str
    pool: str
    capacity: int
    engine: str
    policy_version: int
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    outstanding: set[tuple[str, int]] = field(default_factory=set)
    """(prompt_id, sample_index) assigned here and not yet received."""
    num_samples: int = 0
    """Samples accepted from this replica."""
    load: object = None
    """Its latest load report (wire message), for status."""
    weights_address: str = ""
    """Where it relays the versions it holds to pool peers; empty = it does not."""
    awaiting_weights: int | None = None
    """A version it will be told about once a pool peer holds it (relay)."""
    latency_profile: tuple[tuple[int, float], ...] = ()
    """PTL(BS): (batch size, seconds per decode step), from Hello, refreshed by load reports."""
    long_tail: bool = False
    """Serves the long tail (at a small batch cap) under skewness-aware dispatch."""
    draining: bool = False
    """It is leaving: assigned nothing more; what it holds it finishes."""
    skewness_bubble_s: Callable[[], float] | None = None
    """Its skewness-bubble seconds so far, read in-process (colocated); else from load reports."""


@dataclass
class _InFlight:
    prompt_id: str
    iteration: int
    dataset_index: int
    answer: str
    token_ids: tuple[int, ...]
    group_size: int
    seed: int
    min_policy_version: int
    received: dict[int, tuple[Sample, float]] = field(default_factory=dict)
    """sample_index -> (sample, reward)."""
    predicted_length: float = 0.0
    """The ranker's prediction, tokens (0 = none); also the in-replica priority (longest first)."""
    long_tail: bool = False
    """Predicted to be in the long tail: served by the long-tail replicas when there are any."""


# Reward of a sample given its prompt's answer.
Scorer = Callable[[Sample, str], float]


class Coordinator:
    def __init__(self, sampling: SamplingConfig, scorer: Scorer, metrics: ServiceMetrics,
                 scale_advantages: bool = True, queue_factor: float = 4.0, relay_pools: frozenset[str] = frozenset()):
        self.sampling = sampling
        self.scorer = scorer
        self.metrics = metrics
        self.scale_advantages = scale_advantages
        self.queue_factor = queue_factor
        self.relay_pools = relay_pools
        self.on_membership_change: Callable[[], None] = lambda: None
        """Called after a replica joins or leaves (the dispatch plan is recomputed)."""
        self.generators: dict[str, GeneratorHandle] = {}
        self._inflight: dict[str, _InFlight] = {}
        self._pending: deque[tuple[str, list[int]]] = deque()  # (prompt_id, sample indices) not assigned
        self._ready: dict[int, deque[_InFlight]] = {}  # iteration -> complete, not yet consumed
        self._ready_event = asyncio.Event()
        self._change = asyncio.Event()  # any generator joined or left
        self.latest_weights: WeightsNotice | None = None
        self.num_prompts_dispatched = 0
        self.num_samples_accepted = 0
        self.num_samples_duplicate_dropped = 0
        self.num_samples_redispatched = 0
        self.num_samples_rejected = 0
        self.num_samples_stale_dropped = 0
        self.weight_syncs: dict[int, dict[str, tuple[float, int, str]]] = {}
        """policy_version -> generator_id -> (seconds from notice to swap, bytes, source)."""
        self._pools_seen: set[str] = set()
        self._departed_skewness_s = 0.0
        self.weight_bytes_by_source: dict[str, int] = {}
        """Weight bytes the replicas received, by source (trainer|peer|local), whole run."""

    # ---- generators -----------------------------------------------------------------
    def connect(self, generator_id: str, pool: str, capacity: int, engine: str, policy_version: int,
                weights_address: str = "", latency_profile: tuple[tuple[int, float], ...] = ()) -> GeneratorHandle:
        if not generator_id:
            raise ValueError("hello.generator_id must not be empty")
        if capacity < 1:
            raise ValueError(f"hello.capacity must be >= 1, got {capacity}")
        if generator_id in self.generators:
            raise KeyError(f"generator {generator_id!r} is connected already")
        handle = GeneratorHandle(generator_id, pool, capacity, engine, policy_version,
                                 weights_address=weights_address, latency_profile=latency_profile)
        self.generators[generator_id] = handle
        latest = self.latest_weights
        if latest and latest.policy_version != policy_version:
            handle.outbox.put_nowait(replace(latest, source=self._holder_address(handle, latest.policy_version)))
        self._count_replicas()
        log.info("generator %s joined (pool %s, capacity %d)", generator_id, pool, capacity)
        self._change.set()
        self.on_membership_change()
        self.dispatch()
        return handle

    def _count_replicas(self) -> None:
        self.metrics.connected_generators.set(len(self.generators))
        pools = {h.pool for h in self.generators.values()} | self._pools_seen
        self._pools_seen = pools
        for pool in pools:
            self.metrics.pool_replicas.labels(pool).set(sum(h.pool == pool for h in self.generators.values()))

    @staticmethod
    def _skewness_s(handle: GeneratorHandle) -> float:
        if handle.skewness_bubble_s is not None:
            return handle.skewness_bubble_s()
        return handle.load.skewness_bubble_s if handle.load is not None else 0.0

    def skewness_bubble_seconds(self) -> float:
        """Skewness-bubble seconds of every replica so far (as last reported; departed ones included)."""
        return self._departed_skewness_s + sum(self._skewness_s(h) for h in self.generators.values())

    async def wait_for_generators(self, num: int = 1) -> None:
        """Return once at least `num` generators are connected."""
        while len(self.generators) < num:
            self._change.clear()
            await self._change.wait()

    def disconnect(self, generator_id: str) -> None:
        handle = self.generators.pop(generator_id, None)
        if handle is None:
            return
        self._count_replicas()
        self._departed_skewness_s += self._skewness_s(handle)
        lost: dict[str, list[int]] = {}
        for prompt_id, idx in handle.outstanding:
            if prompt_id in self._inflight and idx not in self._inflight[prompt_id].received:
                lost.setdefault(prompt_id, []).append(idx)
        for prompt_id, indices in lost.items():
            self._pending.appendleft((prompt_id, sorted(indices)))
            self.num_samples_redispatched += len(indices)
            self.metrics.samples_redispatched.inc(len(indices))
        (log.info if handle.draining and not lost else log.warning)(
            "generator %s left; %d unfinished samples go back to the queue", generator_id,
            sum(map(len, lost.values())))
        self._reseed(handle.pool)
        self.on_membership_change()
        self._change.set()
        self.dispatch()

    def on_loaded(self, generator_id: str, policy_version: int, sync_s: float = 0.0, size_bytes: int = 0,
                  source: str = "") -> None:
        """A replica swapped in a version: record how long it took, and let its pool peers
        waiting for the version fetch it from this replica."""
        loader = self.generators.get(generator_id)
        if loader is None:
            return
        self.weight_syncs.setdefault(policy_version, {})[generator_id] = (sync_s, size_bytes, source)
        self.weight_bytes_by_source[source] = self.weight_bytes_by_source.get(source, 0) + size_bytes
        while len(self.weight_syncs) > 8:
            del self.weight_syncs[min(self.weight_syncs)]
        loader.policy_version = policy_version
        if loader.awaiting_weights is not None and loader.awaiting_weights <= policy_version:
            loader.awaiting_weights = None
        latest = self.latest_weights
        if latest is None or latest.policy_version != policy_version or not loader.weights_address:
            return
        for h in self.generators.values():
            if h.pool == loader.pool and h.awaiting_weights == policy_version:
                h.awaiting_weights = None
                h.outbox.put_nowait(replace(latest, source=loader.weights_address))

    # ---- weights ----------------------------------------------------------------------
    def _holder_address(self, handle: GeneratorHandle, policy_version: int) -> str:
        """A pool peer of `handle` that holds the version and relays it; "" = the trainer."""
        if handle.pool not in self.relay_pools:
            return ""
        for h in self.generators.values():
            if h is not handle and h.pool == handle.pool and h.weights_address and h.policy_version == policy_version:
                return h.weights_address
        return ""

    def announce_weights(self, notice: WeightsNotice) -> None:
        """Tell every replica about a new version. In a relay pool only one replica (the
        seed) fetches it from the trainer; the others are told to fetch from it once it
        holds the version, so one copy crosses the link to the pool."""
        self.latest_weights = notice
        seeded: set[str] = set()
        for h in self.generators.values():
            if h.pool in self.relay_pools and h.weights_address:
                if h.pool in seeded:
                    h.awaiting_weights = notice.policy_version
                    continue
                seeded.add(h.pool)
            h.awaiting_weights = None
            h.outbox.put_nowait(notice)

    def _reseed(self, pool: str) -> None:
        """The pool's seed left before its peers were told where to fetch: appoint another."""
        latest = self.latest_weights
        waiting = [h for h in self.generators.values() if h.pool == pool and h.awaiting_weights is not None]
        if not waiting or latest is None:
            return
        fetching = any(h.pool == pool and h.awaiting_weights is None and h.policy_version != latest.policy_version
                       for h in self.generators.values())
        if not fetching:
            seed = waiting[0]
            seed.awaiting_weights = None
            seed.outbox.put_nowait(replace(latest, source=self._holder_address(seed, latest.policy_version)))

    # ---- work -----------------------------------------------------------------------
    def add_prompts(self, iteration: int, prompts: list[tuple[str, int, str, tuple[int, ...]]],
                    group_size: int, min_policy_version: int,
                    predicted: dict[str, tuple[float, bool]] | None = None) -> None:
        """Queue (prompt_id, dataset_index, answer, token_ids) prompts of one iteration.
        With predictions {prompt_id: (length, long_tail)} they go out longest first."""
        predicted = predicted or {}
        if predicted:
            prompts = sorted(prompts, key=lambda p: -predicted.get(p[0], (0.0, False))[0])
        for prompt_id, dataset_index, answer, token_ids in prompts:
            seed = (self.sampling.seed << 32) + zlib.crc32(prompt_id.encode())
            length, long_tail = predicted.get(prompt_id, (0.0, False))
            self._inflight[prompt_id] = _InFlight(prompt_id, iteration, dataset_index, answer, token_ids,
                                                  group_size, seed, min_policy_version,
                                                  predicted_length=length, long_tail=long_tail)
            self._pending.append((prompt_id, list(range(group_size))))
        self.dispatch()

    def set_long_tail_replicas(self, replica_ids: set[str], batch_cap: int) -> None:
        """Route long-tail prompts to these replicas, which decode at most batch_cap at once;
        the others run at full capacity and take the rest."""
        for h in self.generators.values():
            long_tail = h.generator_id in replica_ids
            if long_tail != h.long_tail or long_tail:
                h.outbox.put_nowait(BatchCap(batch_cap if long_tail else 0))
            h.long_tail = long_tail
        self.dispatch()

    def _next_for(self, handle: GeneratorHandle) -> int | None:
        """Index in the pending queue of the first work this replica may take."""
        routed = any(h.long_tail for h in self.generators.values()) and \
            any(not h.long_tail for h in self.generators.values())
        for i, (prompt_id, _) in enumerate(self._pending):
            task = self._inflight.get(prompt_id)
            if not routed or task is None or task.long_tail == handle.long_tail:
                return i
        return None

    def _allowance(self, h: GeneratorHandle) -> int:
        """Samples a replica may hold at once: queue_factor batches of its capacity."""
        return max(1, round(h.capacity * self.queue_factor))

    def _room(self, h: GeneratorHandle) -> int:
        return 0 if h.draining else self._allowance(h) - len(h.outstanding)

    def drain(self, generator_id: str, reason: str = "") -> None:
        """A replica is leaving gracefully: nothing more for it; the rest of the pool (and
        the dispatch plan) carries on without it."""
        handle = self.generators.get(generator_id)
        if handle is None or handle.draining:
            return
        handle.draining = True
        log.info("generator %s is draining (%s) with %d samples to finish", generator_id, reason or "no reason",
                 len(handle.outstanding))
        self.on_membership_change()
        self.dispatch()
        self._release_if_drained(handle)

    @staticmethod
    def _release_if_drained(handle: GeneratorHandle) -> None:
        """A draining replica whose every assigned sample arrived: end its stream (it exits)."""
        if handle.draining and not handle.outstanding:
            handle.outbox.put_nowait(None)

    def dispatch(self) -> None:
        """Hand pending samples to the generators with the most room, a whole prompt at a
        time (a group larger than a replica's whole allowance is split); long-tail prompts
        only to long-tail replicas while both kinds exist."""
        progress = True
        while progress and self._pending and self.generators:
            progress = False
            for handle in sorted(self.generators.values(), key=self._room, reverse=True):
                room = self._room(handle)
                index = self._next_for(handle) if room > 0 else None
                if index is None:
                    continue
                prompt_id, indices = self._pending[index]
                task = self._inflight.get(prompt_id)
                indices = [i for i in indices if task and i not in task.received]
                if len(indices) > room and room < self._allowance(handle):
                    continue  # keep a group on one replica: wait until it fits whole
                del self._pending[index]
                take, rest = indices[:room], indices[room:]
                if rest:
                    self._pending.insert(index, (prompt_id, rest))
                if take:
                    handle.outstanding.update((prompt_id, i) for i in take)
                    sp = self.sampling
                    handle.outbox.put_nowait(Work(prompt_id, task.token_ids, tuple(take), sp.temperature, sp.top_p,
                                                  sp.max_new_tokens, task.seed, task.min_policy_version,
                                                  priority=task.predicted_length))
                    self.num_prompts_dispatched += 1
                progress = True
                break

    def on_sample(self, generator_id: str, sample: Sample) -> bool:
        """Take a finished sample; False when it was dropped (duplicate, unknown or malformed)."""
        handle = self.generators.get(generator_id)
        key = (sample.prompt_id, sample.sample_index)
        if handle is not None:
            handle.outstanding.discard(key)
            self._release_if_drained(handle)
        task = self._inflight.get(sample.prompt_id)
        if task is None or sample.sample_index in task.received:
            self.num_samples_duplicate_dropped += 1
            self.metrics.samples_duplicate.inc()
            self.dispatch()
            return False
        if sample.sample_index >= task.group_size or len(sample.logprobs) != len(sample.completion_token_ids):
            self.num_samples_rejected += 1
            log.warning("rejected malformed sample %s/%d from %s", *key, generator_id)
            self._pending.appendleft((sample.prompt_id, [sample.sample_index]))
            self.dispatch()
            return False
        task.received[sample.sample_index] = (sample, self.scorer(sample, task.answer))
        self.num_samples_accepted += 1
        self.metrics.samples_accepted.inc()
        if handle is not None:
            handle.num_samples += 1
        if len(task.received) == task.group_size:
            self._complete(task)
        self.dispatch()
        return True

    def _complete(self, task: _InFlight) -> None:
        del self._inflight[task.prompt_id]
        self._ready.setdefault(task.iteration, deque()).append(task)
        self._ready_event.set()

    def _score(self, task: _InFlight) -> Group:
        ordered = [task.received[i] for i in range(task.group_size)]
        advantages = group_advantages([r for _, r in ordered], self.scale_advantages)
        scored = tuple(ScoredSample(s, r, a) for (s, r), a in zip(ordered, advantages))
        return Group(task.prompt_id, task.iteration, task.dataset_index, task.token_ids, scored)

    def _drop_stale(self, task: _InFlight, min_policy_version: int) -> bool:
        """Re-issue the samples older than min_policy_version; True when any were."""
        stale = [i for i, (s, _) in task.received.items() if s.policy_version < min_policy_version]
        if not stale:
            return False
        for i in stale:
            del task.received[i]
        task.min_policy_version = max(task.min_policy_version, min_policy_version)
        self._inflight[task.prompt_id] = task
        self._pending.appendleft((task.prompt_id, sorted(stale)))
        self.num_samples_stale_dropped += len(stale)
        self.metrics.samples_stale.inc(len(stale))
        log.warning("dropped %d samples of %s older than v%d; re-issued", len(stale), task.prompt_id,
                    min_policy_version)
        self.dispatch()
        return True

    def _ready_samples(self, iteration: int) -> int:
        return sum(t.group_size for t in self._ready.get(iteration, ()))

    async def take_groups(self, iteration: int, min_samples: int, max_samples: int,
                          min_policy_version: int = 0) -> list[Group]:
        """Wait until complete groups of `iteration` hold at least min_samples samples;
        return groups (at least one) holding at most max_samples unless a single group is
        larger. Samples older than min_policy_version are dropped and re-issued instead."""
        while True:
            while self._ready_samples(iteration) < min_samples:
                self._ready_event.clear()
                await self._ready_event.wait()
            queue = self._ready[iteration]
            out: list[Group] = []
            total = 0
            while queue and (not out or total + queue[0].group_size <= max_samples):
                task = queue.popleft()
                if self._drop_stale(task, min_policy_version):
                    continue
                out.append(self._score(task))
                total += task.group_size
            if not queue:
                del self._ready[iteration]
            if out:
                return out

    def close(self) -> None:
        """End every generator's stream (the run is over)."""
        for handle in self.generators.values():
            handle.outbox.put_nowait(None)

    def weight_sync_summary(self, policy_version: int) -> dict:
        """How a version reached the replicas (those that reported so far): slowest swap,
        bytes from the trainer and from peers."""
        syncs = self.weight_syncs.get(policy_version, {})
        return {
            "weight_sync_s_max": max((s for s, _, _ in syncs.values()), default=0.0),
            "weight_bytes_from_trainer": sum(b for _, b, src in syncs.values() if src == "trainer"),
            "weight_bytes_from_peers": sum(b for _, b, src in syncs.values() if src == "peer"),
        }

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    def status(self) -> dict:
        return {
            "generators": {
                g.generator_id: GeneratorStatus(
                    pool=g.pool, capacity=g.capacity, outstanding=len(g.outstanding),
                    policy_version=g.policy_version, num_samples=g.num_samples,
                    tokens_per_s=round(g.load.tokens_per_s, 1) if g.load else None,
                    weights_address=g.weights_address, latency_profile=list(g.latency_profile))
                for g in self.generators.values()
            },
            "num_prompts_inflight": len(self._inflight),
            "num_samples_pending": sum(len(i) for _, i in self._pending),
            "num_groups_ready": sum(len(q) for q in self._ready.values()),
        }
