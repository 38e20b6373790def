"""A generator replica's link to the trainer: dials it, takes work, streams every sample back
the moment it finishes, has new weights pulled in the background (WeightFetcher), reports
its load, and drains when asked to leave.

A stream the trainer ends (status OK) is its goodbye: the run is over, the replica exits 0.
A stream that breaks (the trainer died, restarted, the link failed) is not: the replica
keeps its engine and weights, abandons the work that stream gave it (the trainer issues it
again), dials again with backoff (spec.generators.reconnect) and says Hello again.

asyncio on the gRPC side (the stream's reader and writer, weight fetches, load reports);
the engine runs on its own thread (Worker), whose callbacks hop onto the event loop.
Queues carry domain messages; streamrl.wire converts at the stream's edge.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from streamrl import compute
from streamrl.generator.engine import Engine
from streamrl.generator.fetcher import WeightFetcher
from streamrl.generator.reconnect import Backoff
from streamrl.generator.relay import Relay
from streamrl.generator.worker import Abandon, LoadWeights, Worker
from streamrl.latency import ptl_batch_sizes
from streamrl.messages import BatchCap, Draining, Hello, LoadReport, WeightsLoaded, WeightsNotice, Welcome, Work
from streamrl.metrics import ServiceMetrics
from streamrl.samples import Sample
from streamrl.spec import ReconnectSpec, SecuritySpec
from streamrl.v1 import rollout_pb2_grpc
from streamrl.wire.channels import open_channel
from streamrl.wire.convert import request_to_pb, response_from_pb
from streamrl.wire.model_files import WAIT_LOG_S
from streamrl.wire.transfer import WeightSource

log = logging.getLogger("streamrl.generator")

_CLOSE = object()

RETRYABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED, grpc.StatusCode.RESOURCE_EXHAUSTED,
})
"""Codes a broken stream may end with that dialling again can mend (the trainer went away, or
failed on something this replica no longer holds). Others (a refused Hello, a bad token)
end the replica with exit 1."""
WELCOME_TIMEOUT_S = 10.0
"""How long a reconnect attempt waits for the trainer's Welcome before it counts as failed."""


@dataclass(frozen=True)
class _Ended:
    """How one Connect stream ended."""

    final: bool
    """True: this replica is done (the trainer's goodbye, drained, stopped, refused)."""
    welcomed: bool
    """The trainer had welcomed it on this stream (a live link broke, not just an attempt)."""
    cause: str = ""
    """Why it broke, for the log (when not final)."""


def _on_compute_thread(fn: Callable[[], None], name: str) -> asyncio.Future:
    """Run `fn` on the process's compute thread (a daemon; streamrl.compute); the future
    completes when it returns."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def target() -> None:
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(done.set_exception, err)
        else:
            loop.call_soon_threadsafe(done.set_result, None)

    compute.start_thread(target, name)
    return done


class GeneratorAgent:
    def __init__(self, engine: Engine, trainer_address: str, generator_id: str, pool: str,
                 metrics: ServiceMetrics, engine_type: str = "torch", relay: Relay | None = None,
                 security: SecuritySpec | None = None, low_occupancy: float = 0.5, started_unix: float = 0.0,
                 reconnect: ReconnectSpec | None = None, in_flight_updates: bool = False):
        self.engine = engine
        self.trainer_address = trainer_address
        self.generator_id = generator_id
        self.pool = pool
        self.engine_type = engine_type
        self.metrics = metrics
        self.relay = relay
        self.security = security or SecuritySpec()
        self.reconnect = reconnect or ReconnectSpec()
        self.worker = Worker(engine, generator_id, metrics, on_sample=self._from_engine, on_loaded=self._loaded,
                             waiting_weights=lambda: bool(self.fetcher.fetching), low_occupancy=low_occupancy,
                             in_flight_updates=in_flight_updates)
        self._stopping = asyncio.Event()
        """Set when the replica leaves (stop, drain timeout, the end of run())."""
        self.fetcher = WeightFetcher(engine, self.worker.inbox, metrics, relay, self.security, self._stopping)
        self.connected = threading.Event()
        """Set while a trainer has welcomed this replica on the live stream (readiness)."""
        self.run_id = ""
        """The run id of the trainer that welcomed it last ("" before the first Welcome)."""
        self.incarnation: int | None = None
        """Welcome.incarnation of the trainer that welcomed it last."""
        self.num_reconnects = 0
        """Times it was welcomed again after its stream broke."""
        self.num_abandoned = 0
        """Samples of broken streams' work dropped, in the engine or unsent (the trainer re-issues them)."""
        self.drain_timeout_s = 120.0
        """A drain that takes longer stops at once (the trainer re-dispatches what is left)."""
        self.report_interval_s = 0.5
        self.wait_log_s = WAIT_LOG_S
        """How often it says what it waits for while the trainer is unreachable."""
        self.exit_code = 0
        self.started_unix = started_unix
        """When this replica's process started (Unix seconds; 0 = unknown): the trainer measures its join."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: asyncio.Queue | None = None
        """The live stream's outgoing messages (a new queue per stream)."""
        self._engine: asyncio.Future | None = None
        self._draining = False
        self._left_early = False
        self._sent_one = False
        self._waiting_since: float | None = None
        """Since when it waits for the trainer's channel before its first stream (monotonic; None: not)."""
        self._broke_at: float | None = None
        """When its latest live stream broke (monotonic; None: never)."""

    # ---- from the engine thread -------------------------------------------------------
    def _from_engine(self, msg: Sample | WeightsLoaded) -> None:
        if isinstance(msg, Sample) and not self._sent_one:
            self._sent_one = True
            log.info("first sample sent%s", self._since_start())
        # The outbox as of now: a sample of a stream that broke lands in that stream's queue,
        # which is dropped (Abandon's ordering guarantees none arrives after the next stream starts).
        assert self._loop is not None and self._outbox is not None  # the engine runs once run() began
        self._loop.call_soon_threadsafe(self._outbox.put_nowait, msg)

    def _since_start(self) -> str:
        return f", {time.time() - self.started_unix:.1f}s after the process started" if self.started_unix else ""

    def _loaded(self, msg: LoadWeights, sync_s: float) -> None:
        self._from_engine(WeightsLoaded(msg.policy_version, sync_s, msg.size_bytes, msg.source))

    # ---- the stream -------------------------------------------------------------------
    async def _requests(self, outbox: asyncio.Queue):
        yield request_to_pb(Hello(
            self.generator_id, self.pool, self.engine.stats().capacity, self.engine_type, self.engine.policy_version,
            self.relay.address if self.relay else "", tuple(self.engine.latency_profile()),
            0.0 if self.run_id else self.started_unix,  # a reconnect is no new process: no join time
            self.fetcher.held_sha256(), without_weights=not self.engine.holds_weights))
        while (msg := await outbox.get()) is not _CLOSE:
            yield request_to_pb(msg)

    async def _read(self, call, welcome_timeout_s: float | None) -> _Ended:
        """Hand what the trainer sends to the engine and the fetcher until the stream ends."""
        welcomed = False
        responses = aiter(call)
        try:
            response = await asyncio.wait_for(anext(responses, None), welcome_timeout_s)
            while response is not None:
                match response_from_pb(response):
                    case Work() as work:
                        self.worker.inbox.put(work)
                    case WeightsNotice() as notice:
                        self.fetcher.notice(notice)
                    case BatchCap() as cap:
                        self.worker.inbox.put(cap)
                    case Welcome() as welcome:
                        welcomed = True
                        self._welcomed(welcome)
                response = await anext(responses, None)
        except TimeoutError:
            return _Ended(False, False, f"no Welcome within {welcome_timeout_s:.0f}s")
        except grpc.aio.AioRpcError as err:
            return self._broke(err, welcomed)
        log.info("drained: the trainer has every sample this replica held" if self._draining
                 else "the trainer closed the stream: the run is over")
        return _Ended(True, welcomed)

    def _broke(self, err: grpc.aio.AioRpcError, welcomed: bool) -> _Ended:
        if self._stopping.is_set():  # cancelled here: stop(), or a drain that timed out
            return _Ended(True, welcomed)
        cause = f"{err.code().name}: {err.details()}"
        if self._draining:
            log.warning("the stream to trainer %s broke while draining (%s): leaving; the trainer issues what this "
                        "replica held again", self.trainer_address, cause)
            return _Ended(True, welcomed)
        if err.code() in RETRYABLE or (err.code() == grpc.StatusCode.ALREADY_EXISTS and self.run_id):
            return _Ended(False, welcomed, cause)  # ALREADY_EXISTS: the trainer has yet to see the old stream go
        log.error("trainer %s refused this replica: %s", self.trainer_address, cause)
        self.exit_code = 1
        return _Ended(True, welcomed)

    def _welcomed(self, welcome: Welcome) -> None:
        restarted = bool(self.run_id) and (welcome.run_id, welcome.incarnation) != (self.run_id, self.incarnation)
        held = self.engine.policy_version
        self.fetcher.welcome(welcome.policy_version)
        if restarted and self.relay:  # its versions above the trainer's may differ from the new trainer's
            self.relay.forget()
        fetch = "" if welcome.policy_version == held else f"; this replica holds v{held} and fetches the trainer's"
        if not self.engine.holds_weights:
            fetch = "; booted from the trainer, it fetches that version before taking work"
        if not self.run_id:
            log.info("connected to trainer run %s (incarnation %d, v%d)%s%s", welcome.run_id, welcome.incarnation,
                     welcome.policy_version, fetch, self._since_start())
        else:
            self.num_reconnects += 1
            log.warning("reconnected to trainer %s: run %s (%s, incarnation %d, v%d)%s", self.trainer_address,
                        welcome.run_id, "a new start of the trainer" if restarted else "the same trainer",
                        welcome.incarnation, welcome.policy_version, fetch)
        self.run_id, self.incarnation = welcome.run_id, welcome.incarnation
        self.connected.set()

    async def _report_load(self, outbox: asyncio.Queue) -> None:
        last_tokens, last_t = 0, time.monotonic()
        while True:
            await asyncio.sleep(self.report_interval_s)
            st = self.engine.stats()
            now = time.monotonic()
            rate = (st.num_generated_tokens - last_tokens) / (now - last_t)
            last_tokens, last_t = st.num_generated_tokens, now
            outbox.put_nowait(LoadReport(st.num_running, st.num_waiting, st.num_generated_tokens, rate,
                                         tuple(self.engine.latency_profile()), self.worker.skewness_bubble_s))

    # ---- lifecycle --------------------------------------------------------------------
    async def run(self) -> int:
        """Connect and serve until the trainer says goodbye (0), a drain completes (0), stop()
        is called (0), the trainer refuses this replica (1) or stays unreachable for
        spec.generators.reconnect.giveUpAfterSeconds, when set, before its first Welcome or
        after a break (1). Unset, a trainer not up yet (queued, loading) or gone (restarting)
        is waited for as long as it takes: not ready meanwhile, saying what it waits for."""
        if self._left_early:
            return 0
        self._loop = asyncio.get_running_loop()
        self._outbox = asyncio.Queue()
        self._engine = _on_compute_thread(self.worker.run, "engine")
        channel = open_channel(self.trainer_address, self.security)
        try:
            if not await self._wait_for_trainer(channel):
                await self._end_before_serving(channel)
                return self.exit_code
            capacity = self.engine.stats().capacity
            sizes = ptl_batch_sizes(capacity)
            t0 = time.monotonic()
            # On the engine thread, where the engine steps from now on.
            ptl = await asyncio.wrap_future(self.worker.submit(self.engine.measure_latency, sizes))
            log.info("PTL(BS) measured at %d batch sizes in %.2fs, ms per decode step: %s", len(sizes),
                     time.monotonic() - t0, ", ".join(f"{b}: {s * 1e3:.2f}" for b, s in ptl))
        except BaseException:
            await self._end_before_serving(channel)
            raise
        try:
            await self._serve(channel)
        finally:
            self._stopping.set()
            self.worker.stop()
            await self._engine  # an engine that failed raises here
        return self.exit_code

    async def _wait_for_trainer(self, channel) -> bool:
        """Until the channel to the trainer is ready (True), stop() (False) or, when set,
        giveUpAfterSeconds pass (False, exit code 1); says every wait_log_s what it waits for."""
        bound = self.reconnect.give_up_after_seconds
        started = self._waiting_since = time.monotonic()
        ready = asyncio.ensure_future(channel.channel_ready())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            while True:
                waited = time.monotonic() - started
                timeout = self.wait_log_s if bound is None else max(0.0, min(self.wait_log_s, bound - waited))
                await asyncio.wait({ready, stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if ready.done():
                    ready.result()
                    return True
                if stopping.done():
                    log.info("stopped while waiting for the trainer at %s", self.trainer_address)
                    return False
                waited = time.monotonic() - started
                if bound is not None and waited >= bound:
                    log.error("giving up: trainer %s unreachable for %.0fs (spec.generators.reconnect."
                              "giveUpAfterSeconds %g)", self.trainer_address, waited, bound)
                    self.exit_code = 1
                    return False
                log.warning("not ready: waiting for %s (%s)", self.waiting_for(),
                            "no bound: spec.generators.reconnect.giveUpAfterSeconds is unset" if bound is None
                            else f"giving up after {bound:g}s")
        finally:
            self._waiting_since = None
            for task in (ready, stopping):
                task.cancel()
            await asyncio.gather(ready, stopping, return_exceptions=True)

    def waiting_for(self) -> str:
        """What keeps this replica from being ready, for /readyz and its log ("" when ready)."""
        if self.connected.is_set():
            return ""
        if self._waiting_since is not None:
            return (f"the trainer at {self.trainer_address} (unreachable for "
                    f"{time.monotonic() - self._waiting_since:.0f}s)")
        if self._broke_at is not None:
            return (f"the trainer at {self.trainer_address} to come back (its stream broke "
                    f"{time.monotonic() - self._broke_at:.0f}s ago; reconnecting)")
        return f"a Welcome from the trainer at {self.trainer_address}"

    async def _end_before_serving(self, channel) -> None:
        await channel.close()
        self.worker.stop()
        assert self._engine is not None  # started by run()
        await self._engine

    async def _serve(self, channel) -> None:
        """One stream after another: after a break, abandon its work and dial again with
        backoff until welcomed, stopped, or past the give-up deadline."""
        backoff: Backoff | None = None
        assert self._engine is not None  # started by run()
        while True:
            try:
                ended = await self._session(channel, WELCOME_TIMEOUT_S if backoff else None)
            finally:
                await channel.close()
            if ended.final or self._stopping.is_set() or self._draining or self._engine.done():
                return
            now = time.monotonic()
            if backoff is None or ended.welcomed:  # a live link broke (not just a failed attempt)
                backoff = Backoff(self.reconnect, now)
                self._broke_at = now
                in_engine, unsent = await self._abandon()
                log.warning("the stream to trainer %s broke (%s): abandoned its work, %d samples generating or "
                            "queued and %d finished but unsent (the trainer issues them again); keeping the engine "
                            "and weights v%d and reconnecting %s", self.trainer_address, ended.cause,
                            in_engine, unsent, self.engine.policy_version,
                            "until it is back (spec.generators.reconnect.giveUpAfterSeconds is unset)"
                            if self.reconnect.give_up_after_seconds is None
                            else f"for up to {self.reconnect.give_up_after_seconds:g}s")
            wait = backoff.next_wait(now)
            if wait is None:
                log.error("giving up: trainer %s not reachable again within %gs of the break "
                          "(spec.generators.reconnect.giveUpAfterSeconds; %d attempts, the last: %s)",
                          self.trainer_address, self.reconnect.give_up_after_seconds, backoff.attempts, ended.cause)
                self.exit_code = 1
                return
            log.warning("reconnecting to trainer %s in %.2fs (attempt %d; cause: %s)", self.trainer_address, wait,
                        backoff.attempts, ended.cause)
            try:
                await asyncio.wait_for(self._stopping.wait(), wait)
                return  # stopped (or asked to drain: there is nothing to finish) while waiting
            except TimeoutError:
                pass
            channel = open_channel(self.trainer_address, self.security)

    async def _session(self, channel, welcome_timeout_s: float | None) -> _Ended:
        """One Connect stream, from Hello until it ends or this replica stops."""
        outbox = self._outbox = asyncio.Queue()
        assert self._engine is not None  # started by run()
        self.fetcher.source = WeightSource(channel)
        call = rollout_pb2_grpc.RolloutStub(channel).Connect(self._requests(outbox))
        reader = asyncio.create_task(self._read(call, welcome_timeout_s), name="reader")
        reporter = asyncio.create_task(self._report_load(outbox), name="load")
        stopping = asyncio.create_task(self._stopping.wait(), name="stopping")
        try:
            await asyncio.wait({reader, stopping, self._engine}, return_when=asyncio.FIRST_COMPLETED)
            if not reader.done():  # stopping, or the engine thread ended
                self._stopping.set()
                outbox.put_nowait(_CLOSE)
                if self._draining:  # let the last samples reach the trainer and its stream end
                    await asyncio.wait({reader}, timeout=10)
                call.cancel()
                await asyncio.wait({reader}, timeout=5)
            if reader.done() and not reader.cancelled():  # a call cancelled here ends its reader cancelled
                return reader.result()
            return _Ended(True, False)
        finally:
            self.connected.clear()
            pending = [reader, reporter, stopping]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await self.fetcher.cancel()

    async def _abandon(self) -> tuple[int, int]:
        """Drop the broken stream's work: (samples dropped from the engine, finished samples
        dropped unsent)."""
        loop = self._loop
        assert loop is not None and self._engine is not None and self._outbox is not None  # as run() set them
        dropped = loop.create_future()
        self.worker.inbox.put(Abandon(lambda n: loop.call_soon_threadsafe(dropped.set_result, n)))
        await asyncio.wait({dropped, self._engine}, return_when=asyncio.FIRST_COMPLETED)
        in_engine = dropped.result() if dropped.done() else 0
        unsent = 0
        while not self._outbox.empty():  # every sample emitted before Abandon is in it by now
            unsent += isinstance(self._outbox.get_nowait(), Sample)
        self.num_abandoned += in_engine + unsent
        return in_engine, unsent

    def stop(self) -> None:
        """Stop at once (thread-safe); the trainer re-dispatches what this replica held."""
        self._call_soon(self._stop)

    def drain(self, reason: str = "") -> None:
        """Leave gracefully (thread-safe): the trainer assigns nothing more, what is held is
        finished, then the stream closes; a second call, or drain_timeout_s, stops at once."""
        self._call_soon(self._drain, reason)

    def _call_soon(self, fn, *args) -> None:
        if self._loop is None:  # asked to leave before it ran: it will not start
            self._left_early = True
            return
        self._loop.call_soon_threadsafe(fn, *args)

    def _stop(self) -> None:
        self._stopping.set()
        self.worker.stop()

    def _drain(self, reason: str) -> None:
        if self._draining:
            self._stop()
            return
        self._draining = True
        if not self.connected.is_set():
            log.info("draining (%s) while %s: this replica holds nothing; leaving", reason or "asked",
                     "reconnecting" if self.run_id else "waiting for the trainer")
            self._stop()
            return
        log.info("draining (%s): finishing the samples this replica holds", reason or "asked")
        # The trainer ends the stream once every sample assigned here has arrived (assignments
        # still on the wire included); then this replica exits.
        assert self._loop is not None and self._outbox is not None  # connected: run() set them
        self._outbox.put_nowait(Draining(reason))
        self._loop.call_later(self.drain_timeout_s, self._stop)
