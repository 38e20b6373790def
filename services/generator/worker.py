"""The engine thread of a generator: takes assignments, steps the engine, emits each
sample the moment it finishes, swaps weights between steps: a version that arrives while
requests run is loaded once they finish, admission held meanwhile (drain-then-update, so
every sample comes from one version), or at once, the running requests going on with it
(in-flight updates, pipeline.inFlightUpdates: their samples carry each token's version).

Transport-agnostic: the gRPC agent (remote replicas) and the colocated trainer (in-process)
feed the same inbox (Work, BatchCap, LoadWeights, TrainerVersion, Abandon, StopWorker) and receive
the same callbacks. The engine thread is its process's compute thread (streamrl.compute):
other torch work of the process is submitted to the worker (`submit`, a Call in the inbox)
and runs between steps: the replica's start-up PTL(BS), the colocated trainer's learner.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import torch

from streamrl.generator.engine import Engine, GenerationRequest
from streamrl.messages import BatchCap, Work
from streamrl.metrics import LOW_OCCUPANCY, NO_WORK, WAITING_WEIGHTS, ServiceMetrics
from streamrl.samples import Sample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadWeights:
    policy_version: int
    tensors: dict[str, torch.Tensor]
    notice_at: float
    """monotonic time the new version was announced (for sync seconds)."""
    size_bytes: int = 0
    source: str = "trainer"
    """Where the bytes came from: "trainer" or "peer"."""
    rollback: bool = False
    """Load it even over a newer version: a restarted trainer resumed from an earlier one."""
    replace: bool = False
    """Load it over the same version number: other weights a resumed trainer published."""


@dataclass(frozen=True)
class TrainerVersion:
    """The newest version the trainer this replica talks to publishes. Work waits while the
    engine holds a newer one (weights of a trainer that has since restarted from an earlier
    version), so no sample comes from weights its trainer never had."""

    policy_version: int


@dataclass(frozen=True)
class Abandon:
    """Drop every request and every deferred assignment (the stream they came on broke: the
    trainer issues them again). `done(n)` is called on the engine thread with how many
    samples were dropped; no sample of that work is emitted after it."""

    done: Callable[[int], object]


class StopWorker:
    """Finish: leave the loop (unfinished work is abandoned; the trainer re-dispatches it)."""


@dataclass(frozen=True)
class Call:
    """Run `fn` on the engine thread, between steps; its result or error goes to `future`."""

    fn: Callable[[], object]
    future: Future


class Worker(Executor):
    def __init__(
        self,
        engine: Engine,
        generator_id: str,
        metrics: ServiceMetrics,
        on_sample: Callable[[Sample], None],
        on_loaded: Callable[[LoadWeights, float], None] = lambda msg, sync_s: None,
        waiting_weights: Callable[[], bool] = lambda: False,
        low_occupancy: float = 0.5,
        in_flight_updates: bool = False,
    ):
        self.engine = engine
        self.generator_id = generator_id
        self.metrics = metrics
        self.inbox: queue.Queue = queue.Queue()
        self._on_sample = on_sample
        self._on_loaded = on_loaded
        self._waiting_weights = waiting_weights
        self.low_occupancy = low_occupancy
        self.in_flight_updates = in_flight_updates
        """pipeline.inFlightUpdates: load a version at once, running requests going on with it."""
        self._draining_for: LoadWeights | None = None
        """Drain-then-update: the version to load once the running requests finish (admission held)."""
        self._deferred: list[Work] = []
        self._sample_of: dict[str, tuple[str, int, int]] = {}
        """request_id -> (prompt_id, sample_index, incarnation of the Work it answers)."""
        self.version_ceiling: int | None = None
        """The trainer's newest version (TrainerVersion); None: no bound (in-process trainer)."""
        self._stopped = threading.Event()
        self._submitting = threading.Lock()
        """Held while a call is queued and while the loop ends: no call is queued after the last drain."""
        self.skewness_bubble_s = 0.0
        """Skewness-bubble seconds so far (also exported as a counter)."""
        self.stepping_s = 0.0
        """Seconds inside the engine's steps so far; the rest of the loop's busy time is its
        bookkeeping and the samples' hand-over (what `streamrl profile` prices per sample)."""

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def submit(self, fn, /, *args, **kwargs) -> Future:
        """Run fn(*args, **kwargs) on the engine thread between steps (an Executor's submit:
        `loop.run_in_executor(worker, ...)` works)."""
        future: Future = Future()
        with self._submitting:
            if self._stopped.is_set():
                raise RuntimeError(f"generator {self.generator_id}: the engine thread has stopped")
            self.inbox.put(Call(lambda: fn(*args, **kwargs), future))
        return future

    def run(self) -> None:
        """The loop; returns after StopWorker (calls still queued fail)."""
        try:
            self._loop()
        finally:
            with self._submitting:
                self._stopped.set()
            while True:
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if isinstance(msg, Call):
                    msg.future.set_exception(RuntimeError(f"generator {self.generator_id}: the engine thread stopped"))

    def _loop(self) -> None:
        clock = self.metrics.clock
        while not self._stopped.is_set():
            block = not self.engine.has_unfinished()
            if block:
                waiting = self._deferred or self._waiting_weights() or not self.engine.holds_weights
                clock.idle(WAITING_WEIGHTS if waiting else NO_WORK)
            self._drain(block)
            self._load_when_drained()
            if self._stopped.is_set() or not self.engine.has_unfinished():
                continue
            before = self.engine.stats()
            # A skewness bubble: a few (long) sequences decoding while the batch has room and
            # nothing waits to fill it (or what waits may not join: a drain for a new version).
            low = ((before.num_waiting == 0 or self._draining_for is not None)
                   and before.num_running < self.low_occupancy * before.capacity)
            clock.busy(LOW_OCCUPANCY if low else "")
            t0 = time.monotonic()
            finished = self.engine.step()
            self.stepping_s += time.monotonic() - t0
            for done in finished:
                self._emit(done)
            st = self.engine.stats()
            self.metrics.generated_tokens.inc(st.num_generated_tokens - before.num_generated_tokens)
            self.metrics.batch_occupancy.set(st.num_running / st.capacity)
            self.metrics.engine_running.set(st.num_running)
            self.metrics.engine_kv_cache_usage.set(st.kv_cache_usage)
            self.metrics.engine_waiting.set(st.num_waiting + sum(len(w.sample_indices) for w in self._deferred))
            if low:
                dt = time.monotonic() - t0
                self.skewness_bubble_s += dt
                self.metrics.skewness_bubble_seconds.inc(dt)
            self._load_when_drained()
        clock.idle(NO_WORK)

    def _drain(self, block: bool) -> None:
        try:
            msg = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(msg)
            if self._stopped.is_set():
                return  # what is queued behind a StopWorker is not handled (calls fail: run)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                break
        self._release_deferred()

    def _handle(self, msg) -> None:
        if isinstance(msg, Work):
            self._deferred.append(msg)
        elif isinstance(msg, LoadWeights):
            # Against the version it will hold: the one a drain waits to load, else the engine's.
            held = self._draining_for.policy_version if self._draining_for else self.engine.policy_version
            stale = (msg.policy_version == held and not msg.replace) or (msg.policy_version < held and not msg.rollback)
            if stale and self.engine.holds_weights:
                return
            if self.in_flight_updates or self.engine.stats().num_running == 0:
                self._load(msg)
            else:
                self._draining_for = msg  # a newer one replaces it: only the newest is loaded
                self.engine.hold_admission(True)
        elif isinstance(msg, BatchCap):
            self.engine.set_batch_cap(msg.max_batch_size)
        elif isinstance(msg, TrainerVersion):
            self.version_ceiling = msg.policy_version
        elif isinstance(msg, Abandon):
            dropped = len(self._sample_of) + sum(len(w.sample_indices) for w in self._deferred)
            self.engine.abort(list(self._sample_of))
            self._sample_of.clear()
            self._deferred.clear()
            msg.done(dropped)
        elif isinstance(msg, Call):
            if msg.future.set_running_or_notify_cancel():
                try:
                    msg.future.set_result(msg.fn())
                except BaseException as err:  # noqa: BLE001 - handed to whoever submitted it
                    msg.future.set_exception(err)
        elif isinstance(msg, StopWorker):
            self._stopped.set()
        else:
            raise TypeError(f"unexpected worker message {msg!r}")

    def _load(self, msg: LoadWeights) -> None:
        self.engine.load_weights(msg.tensors.items(), msg.policy_version)
        sync_s = time.monotonic() - msg.notice_at
        self.metrics.policy_version.set(msg.policy_version)
        self.metrics.weight_sync_seconds.observe(sync_s)
        self._on_loaded(msg, sync_s)

    def _load_when_drained(self) -> None:
        """Drain-then-update: once no request runs, load the version waited for and admit again
        (the work that waited for it included)."""
        if self._draining_for is None or self.engine.stats().num_running > 0:
            return
        msg, self._draining_for = self._draining_for, None
        try:
            self._load(msg)
        finally:
            self.engine.hold_admission(False)
        self._release_deferred()

    def _release_deferred(self) -> None:
        held, ceiling = self.engine.policy_version, self.version_ceiling
        if not self.engine.holds_weights:
            return  # booted from the trainer: no work before the first version is in
        if ceiling is not None and held > ceiling:
            return  # these weights are newer than the trainer's: wait for its version
        ready = [w for w in self._deferred if w.min_policy_version <= held]
        if not ready:
            return
        self._deferred = [w for w in self._deferred if w.min_policy_version > held]
        for w in ready:
            for i in w.sample_indices:
                rid = f"{w.prompt_id}/{i}"
                self._sample_of[rid] = (w.prompt_id, i, w.incarnation)
                self.engine.add_request(GenerationRequest(
                    rid, w.prompt_token_ids, w.max_new_tokens, w.temperature, w.top_p, w.seed + i, w.priority,
                ))

    def _emit(self, done) -> None:
        prompt_id, index, incarnation = self._sample_of.pop(done.request_id)
        self.metrics.samples_streamed.inc()
        self._on_sample(Sample(prompt_id, index, done.token_ids, done.logprobs, done.policy_version,
                               done.finish_reason, self.generator_id, done.queue_s, done.generate_s, incarnation,
                               done.version_runs))

    def stop(self) -> None:
        self.inbox.put(StopWorker())
