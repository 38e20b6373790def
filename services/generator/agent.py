"""A generator replica's link to the trainer: dials it, takes work, streams every sample back
the moment it finishes, pulls new weights in the background (from a pool peer when told),
reports its load, and drains when asked to leave.

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

import grpc

from streamrl.generator.engine import Engine, ptl_batch_sizes
from streamrl.generator.relay import Relay
from streamrl.generator.worker import LoadWeights, Worker
from streamrl.messages import BatchCap, Draining, Hello, LoadReport, WeightsLoaded, WeightsNotice, Welcome, Work
from streamrl.metrics import ServiceMetrics
from streamrl.samples import Sample
from streamrl.spec import SecuritySpec
from streamrl.v1 import rollout_pb2_grpc
from streamrl.weights import WeightsCorruptError, deserialize
from streamrl.wire.channels import open_channel
from streamrl.wire.convert import request_to_pb, response_from_pb
from streamrl.wire.transfer import WeightSource, fetch_blob

log = logging.getLogger("streamrl.generator")

_CLOSE = object()


def _on_thread(fn: Callable[[], None], name: str) -> asyncio.Future:
    """Run `fn` on a daemon thread; the future completes when it returns."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def target() -> None:
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(done.set_exception, err)
        else:
            loop.call_soon_threadsafe(done.set_result, None)

    threading.Thread(target=target, name=name, daemon=True).start()
    return done


class GeneratorAgent:
    def __init__(self, engine: Engine, trainer_address: str, generator_id: str, pool: str,
                 metrics: ServiceMetrics, engine_type: str = "torch", relay: Relay | None = None,
                 security: SecuritySpec | None = None, low_occupancy: float = 0.5, started_unix: float = 0.0):
        self.engine = engine
        self.trainer_address = trainer_address
        self.generator_id = generator_id
        self.pool = pool
        self.engine_type = engine_type
        self.metrics = metrics
        self.relay = relay
        self.security = security or SecuritySpec()
        self.worker = Worker(engine, generator_id, metrics, on_sample=self._from_engine, on_loaded=self._loaded,
                             waiting_weights=lambda: bool(self._fetching), low_occupancy=low_occupancy)
        self.connected = threading.Event()
        """Set once the trainer welcomed this replica (readiness)."""
        self.drain_timeout_s = 120.0
        """A drain that takes longer stops at once (the trainer re-dispatches what is left)."""
        self.report_interval_s = 0.5
        self.exit_code = 0
        self.started_unix = started_unix
        """When this replica's process started (Unix seconds; 0 = unknown): the trainer measures its join."""
        self._fetching: set[int] = set()
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: asyncio.Queue | None = None
        self._stopping: asyncio.Event | None = None
        self._draining = False
        self._left_early = False
        self._sent_one = False

    # ---- from the engine thread -------------------------------------------------------
    def _from_engine(self, msg: Sample | WeightsLoaded) -> None:
        if isinstance(msg, Sample) and not self._sent_one:
            self._sent_one = True
            log.info("first sample sent%s", self._since_start())
        self._loop.call_soon_threadsafe(self._outbox.put_nowait, msg)

    def _since_start(self) -> str:
        return f", {time.time() - self.started_unix:.1f}s after the process started" if self.started_unix else ""

    def _loaded(self, msg: LoadWeights, sync_s: float) -> None:
        self._from_engine(WeightsLoaded(msg.policy_version, sync_s, msg.size_bytes, msg.source))

    # ---- the stream -------------------------------------------------------------------
    async def _requests(self):
        yield request_to_pb(Hello(
            self.generator_id, self.pool, self.engine.stats().capacity, self.engine_type, self.engine.policy_version,
            self.relay.address if self.relay else "", tuple(self.engine.latency_profile()), self.started_unix))
        while (msg := await self._outbox.get()) is not _CLOSE:
            yield request_to_pb(msg)

    async def _read(self, call) -> None:
        try:
            async for response in call:
                match response_from_pb(response):
                    case Work() as work:
                        self.worker.inbox.put(work)
                    case WeightsNotice() as notice:
                        self._start_fetch(notice)
                    case BatchCap() as cap:
                        self.worker.inbox.put(cap)
                    case Welcome() as welcome:
                        self.connected.set()
                        log.info("connected to trainer run %s (v%d)%s", welcome.run_id, welcome.policy_version,
                                 self._since_start())
            log.info("drained: the trainer has every sample this replica held" if self._draining
                     else "trainer closed the stream")
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                log.error("stream to trainer failed: %s %s", err.code().name, err.details())
                self.exit_code = 1
        finally:
            self._stopping.set()
            self.worker.stop()

    async def _report_load(self) -> None:
        last_tokens, last_t = 0, time.monotonic()
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), self.report_interval_s)
            except TimeoutError:
                pass
            st = self.engine.stats()
            now = time.monotonic()
            rate = (st.num_generated_tokens - last_tokens) / (now - last_t)
            last_tokens, last_t = st.num_generated_tokens, now
            self._outbox.put_nowait(LoadReport(st.num_running, st.num_waiting, st.num_generated_tokens, rate,
                                               tuple(self.engine.latency_profile()), self.worker.skewness_bubble_s))

    # ---- weights ----------------------------------------------------------------------
    def _start_fetch(self, notice: WeightsNotice) -> None:
        if notice.policy_version <= self.engine.policy_version or notice.policy_version in self._fetching:
            return
        self._fetching.add(notice.policy_version)
        task = asyncio.create_task(self._fetch_and_load(notice, time.monotonic()),
                                   name=f"fetch-v{notice.policy_version}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fetch(self, notice: WeightsNotice, source: WeightSource) -> tuple[bytes, str]:
        """The version's bytes from the named peer, or from the trainer when there is none
        or it fails; returns (blob, "peer" | "trainer")."""
        if notice.source:
            channel = open_channel(notice.source, self.security)
            try:
                return await fetch_blob(WeightSource(channel), notice, max_attempts=2, stopping=self._stopping), "peer"
            except grpc.aio.AioRpcError as err:
                if self._stopping.is_set():
                    raise
                log.warning("peer %s could not serve v%d (%s); fetching from the trainer", notice.source,
                            notice.policy_version, err.code().name)
            finally:
                await channel.close()
        return await fetch_blob(source, notice, stopping=self._stopping), "trainer"

    async def _fetch_and_load(self, notice: WeightsNotice, t0: float) -> None:
        try:
            blob, source = await self._fetch(notice, self._weights)
            if self.relay:
                self.relay.hold(await asyncio.to_thread(self.relay.chunked, notice.policy_version, blob))
            self.metrics.weight_sync_bytes.labels(source).inc(len(blob))
            self.metrics.weight_fetch_seconds.labels(source).observe(time.monotonic() - t0)
            tensors = await asyncio.to_thread(deserialize, blob)
            self.worker.inbox.put(LoadWeights(notice.policy_version, tensors, t0, len(blob), source))
        except (WeightsCorruptError, grpc.aio.AioRpcError) as err:
            if not self._stopping.is_set():
                log.error("weights v%d rejected, keeping v%d: %s", notice.policy_version,
                          self.engine.policy_version, err)
        finally:
            self._fetching.discard(notice.policy_version)

    # ---- lifecycle --------------------------------------------------------------------
    async def run(self, connect_timeout_s: float = 60.0) -> int:
        """Connect and serve until the trainer closes the stream (0), the link breaks (1) or
        stop() is called (0)."""
        if self._left_early:
            return 0
        self._loop = asyncio.get_running_loop()
        self._outbox = asyncio.Queue()
        self._stopping = asyncio.Event()
        channel = open_channel(self.trainer_address, self.security)
        self._weights = WeightSource(channel)
        try:
            try:
                await asyncio.wait_for(channel.channel_ready(), connect_timeout_s)
            except TimeoutError:
                log.error("trainer %s unreachable after %.0fs", self.trainer_address, connect_timeout_s)
                return 1
            capacity = self.engine.stats().capacity
            sizes = ptl_batch_sizes(capacity)
            t0 = time.monotonic()
            await asyncio.to_thread(self.engine.measure_latency, sizes)
            log.info("PTL(BS) measured at %d batch sizes in %.2fs", len(sizes), time.monotonic() - t0)
            call = rollout_pb2_grpc.RolloutStub(channel).Connect(self._requests())
            reader = asyncio.create_task(self._read(call), name="reader")
            reporter = asyncio.create_task(self._report_load(), name="load")
            await _on_thread(self.worker.run, "engine")
            self._stopping.set()
            self._outbox.put_nowait(_CLOSE)
            if self._draining:  # let the last samples reach the trainer and its stream end
                await asyncio.wait({reader}, timeout=10)
            call.cancel()
            await asyncio.wait({reader, reporter, *self._tasks}, timeout=5)
            return self.exit_code
        finally:
            await channel.close()

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
        log.info("draining (%s): finishing the samples this replica holds", reason or "asked")
        # The trainer ends the stream once every sample assigned here has arrived (assignments
        # still on the wire included); then this replica exits.
        self._outbox.put_nowait(Draining(reason))
        self._loop.call_later(self.drain_timeout_s, self._stop)
