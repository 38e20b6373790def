"""A simulated generator replica: continuous batching in the product's admission order, work
held until its weight version is here, versions swapped (once the running sequences finish,
admission held meanwhile, or under them with in-flight updates: the worker's rule) and finished
samples sent between decode steps; a stretch of steps with the same batch is one event. Knows
its GenerationCost, not dispatch."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from streamrl.latency import observe_ptl
from streamrl.metrics import LOW_OCCUPANCY, NO_WORK, WAITING_WEIGHTS
from streamrl.planning.costs import GenerationCost
from streamrl.rollout import work
from streamrl.simulation.events import Event, Simulation, Track

LOAD_REPORT_INTERVAL_S = 0.5
"""How often a replica sends its load report (GeneratorAgent.report_interval_s), its PTL(BS) in it."""


@dataclass
class Sequence:
    prompt_id: str
    index: int
    length: int
    """Output tokens it will produce."""
    prompt_tokens: int
    min_policy_version: int
    priority: float
    produced: int = 0
    policy_version: int = -1
    """The version that produced its first token."""


@dataclass
class _Stretch:
    start: float
    prefill_s: float
    step_s: float
    steps: int
    low: bool
    """A skewness bubble: nothing waits and fewer than lowOccupancy of the batch cap run."""
    event: Event | None = None


class SimReplica:
    def __init__(self, sim: Simulation, generator_id: str, pool: str, cost: GenerationCost, capacity: int,
                 track: Track, on_sample: Callable[[SimReplica, Sequence], None],
                 on_loaded: Callable[[SimReplica, int], None], low_occupancy: float = 0.5, load_s: float = 0.0,
                 policy_version: int = 0, sample_s: float = 0.0, ptl: tuple[tuple[int, float], ...] = (),
                 on_report: Callable[[SimReplica], None] | None = None, in_flight_updates: bool = False):
        self.sim, self.generator_id, self.pool, self.cost = sim, generator_id, pool, cost
        self.capacity = self.batch_cap = capacity
        self.track = track
        self.on_sample, self.on_loaded = on_sample, on_loaded
        self.low_occupancy, self.load_s = low_occupancy, load_s
        self.in_flight_updates = in_flight_updates
        """pipeline.inFlightUpdates: a fetched version loads under running sequences (else after them)."""
        self.sample_s = sample_s
        """Seconds per finished sample spent between steps (sending it; in-process, its intake)."""
        self.ptl = dict(ptl)
        """Its PTL(BS) as a replica keeps it: measured at start-up, then smoothed over served steps."""
        self._on_report = on_report
        self._reported_at = sim.now
        self._lent_s = 0.0
        """Seconds of its core another process used while it decoded, paid before its next step."""
        self._lent_stretch_s = 0.0
        """Of those, the ones lent during the current stretch: its steps' wall time, as a replica times them."""
        self._sending = False
        self.policy_version = policy_version
        self.fetching = False
        """A version is on its way (the idle reason is then waiting for weights)."""
        self.fetch_source = "trainer"
        """Where the last fetched version came from (trainer | peer)."""
        self._fetched: int | None = None
        self._loading = False
        self._deferred: list[Sequence] = []
        self._waiting: list[tuple[tuple[float, int], Sequence]] = []
        self._arrival = itertools.count()
        self.running: list[Sequence] = []
        self._stretch: _Stretch | None = None
        self._skewness_s = 0.0
        self.held_since = sim.now
        """Since when its GPUs are paid for (an added replica: from its addition, before it joined)."""
        self.num_samples = 0
        self.num_tokens = 0
        self.closed = False

    # ---- what comes in ------------------------------------------------------------------
    def give(self, sequences: list[Sequence]) -> None:
        """Work, in the order sent (held until its weight version is here)."""
        self._deferred.extend(sequences)
        self._poke(admitting=True)

    def set_batch_cap(self, max_batch_size: int) -> None:
        """The engine's set_batch_cap: 0 = full capacity; running sequences above the cap finish."""
        cap = min(max_batch_size, self.capacity) if max_batch_size > 0 else self.capacity
        if cap != self.batch_cap:
            self.batch_cap = cap
            self._poke(admitting=False)

    def weights_fetched(self, policy_version: int) -> None:
        """A version arrived; it is swapped in between two steps."""
        if policy_version > max(self.policy_version, self._fetched or -1):
            self._fetched = policy_version
            self._poke(admitting=False)
        elif self._fetched is None and not self._loading:  # nothing newer: no longer waiting for weights
            self.fetching = False
            if self.idle:
                self.track.set("idle", WAITING_WEIGHTS if self._deferred else NO_WORK)

    def share_core(self, seconds: float) -> None:
        """Another process on its core worked `seconds` now: if it is working too (decoding,
        sending), it loses them."""
        if self._stretch is not None or self._sending:
            self._lent_s += seconds
        if self._stretch is not None:
            self._lent_stretch_s += seconds

    # ---- reading ------------------------------------------------------------------------
    def skewness_seconds(self) -> float:
        s = self._stretch
        return self._skewness_s + (self.sim.now - s.start if s is not None and s.low else 0.0)

    @property
    def idle(self) -> bool:
        return self._stretch is None and not self._loading and not self._sending

    # ---- the loop -----------------------------------------------------------------------
    def _poke(self, admitting: bool) -> None:
        """Something changed: start stepping when idle, else end the current stretch after the
        step in progress when the change matters to the batch."""
        if self.closed or self._loading or self._sending:
            return
        s = self._stretch
        if s is None:
            self._next()
            return
        if admitting and not (len(self.running) < self.batch_cap and self._releasable() and not self._draining):
            return
        done = max(1, math.ceil((self.sim.now - s.start - s.prefill_s) / s.step_s - 1e-9)) if s.step_s > 0 else 1
        if done < s.steps:
            s.steps = done
            assert s.event is not None  # set as the stretch began
            s.event.cancel()
            s.event = self.sim.at(s.start + s.prefill_s + done * s.step_s, self._stretch_done)

    @property
    def _draining(self) -> bool:
        """Drain-then-update: a version waits for the running sequences; nothing is admitted."""
        return self._fetched is not None and not self.in_flight_updates

    def _releasable(self) -> bool:
        return bool(self._waiting) or any(q.min_policy_version <= self.policy_version for q in self._deferred)

    def _release(self) -> None:
        ready = [q for q in self._deferred if q.min_policy_version <= self.policy_version]
        if ready:
            self._deferred = [q for q in self._deferred if q.min_policy_version > self.policy_version]
            for q in ready:
                heapq.heappush(self._waiting, (work.admission_key(q.priority, next(self._arrival)), q))

    def _next(self) -> None:
        """At a step boundary: swap in fetched weights, release and admit work, start a stretch."""
        if self.closed:
            return
        if self._fetched is not None and (self.in_flight_updates or not self.running):
            version, self._fetched = self._fetched, None
            if not self.running:
                self.track.set("idle", WAITING_WEIGHTS)
            self._loading = True
            self.sim.after(self.load_s, self._loaded, version)
            return
        self._release()
        admitted = []
        while self._waiting and len(self.running) < self.batch_cap and not self._draining:
            _, q = heapq.heappop(self._waiting)
            q.produced, q.policy_version = 1, self.policy_version  # prefill samples the first token
            admitted.append(q)
            self.running.append(q)
        if not self.running:
            self.track.set("idle", WAITING_WEIGHTS if (self._deferred or self.fetching) else NO_WORK)
            return
        prefill_s = self.cost.prefill_s(sum(q.prompt_tokens for q in admitted)) if admitted else 0.0
        self.num_tokens += len(admitted)
        steps = min(q.length - q.produced for q in self.running)
        batch = len(self.running)
        # every step of the stretch at its middle step's mean context (or longest: padded attention)
        contexts = [q.prompt_tokens + q.produced for q in self.running]
        longest = getattr(self.cost, "padded_attention", False)
        context = (max(contexts) if longest else sum(contexts) / batch) + max(0, steps - 1) / 2
        step_s = self.cost.decode_step_s(batch, int(round(context)))
        low = (not self._waiting or self._draining) and batch < self.low_occupancy * self.batch_cap
        self.track.set("busy", LOW_OCCUPANCY if low else "")
        s = self._stretch = _Stretch(self.sim.now, prefill_s, step_s, steps, low)
        s.event = self.sim.at(s.start + prefill_s + steps * step_s, self._stretch_done)

    def _stretch_done(self) -> None:
        s, self._stretch = self._stretch, None
        assert s is not None  # the event of the stretch running
        if s.low:
            self._skewness_s += self.sim.now - s.start
        self.num_tokens += s.steps * len(self.running)
        lent, self._lent_stretch_s = self._lent_stretch_s, 0.0
        if s.steps:  # a replica times a step's wall clock: what its core lent meanwhile is in it
            observe_ptl(self.ptl, len(self.running), s.step_s + lent / s.steps, s.steps)
        if self._on_report is not None and self.sim.now - self._reported_at >= LOAD_REPORT_INTERVAL_S:
            self._reported_at = self.sim.now
            self._on_report(self)
        finished = []
        for q in self.running:
            q.produced += s.steps
            if q.produced >= q.length:
                finished.append(q)
        if finished:
            self.running = [q for q in self.running if q.produced < q.length]
            self.num_samples += len(finished)
            for q in finished:
                self.on_sample(self, q)
        pause, self._lent_s = len(finished) * self.sample_s + self._lent_s, 0.0
        if pause > 0:  # the samples leave, and what its core lent is paid, before the next step
            self._sending = True
            self.sim.after(pause, self._sent)
            return
        self._next()

    def _sent(self) -> None:
        if self._lent_s > 0:  # lent while it sent
            pause, self._lent_s = self._lent_s, 0.0
            self.sim.after(pause, self._sent)
            return
        self._sending = False
        self._next()

    def _loaded(self, version: int) -> None:
        self._loading = False
        self.policy_version = max(self.policy_version, version)
        self.fetching = self._fetched is not None
        self.on_loaded(self, version)
        self._next()

    def close(self) -> None:
        """It left (drained): nothing more happens on it."""
        self.closed = True
        if self._stretch is not None and self._stretch.event is not None:
            self._stretch.event.cancel()
        self.track.close()
