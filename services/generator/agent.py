"""`streamrl generator`: a replica that dials the trainer, takes work, streams every
sample back the moment it finishes, and pulls new weights in the background.

Threads: the engine worker (main loop), a reader of the trainer's stream, a weight
fetcher per new version, a load reporter, and the relay server that hands the versions
this replica holds to its pool peers. gRPC <-> domain conversion happens here.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import grpc

from streamrl.generator.engine import Engine
from streamrl.generator.worker import Cancel, LoadWeights, SetBatchCap, Worker
from streamrl.metrics import ServiceMetrics
from streamrl.samples import WeightsNotice
from streamrl.transfer import RelayServer, WeightSource, fetch_blob
from streamrl.v1 import rollout_pb2 as pb
from streamrl.v1 import rollout_pb2_grpc
from streamrl.weights import WeightsCorruptError, deserialize
from streamrl.wire import GRPC_OPTIONS, notice_from_pb, sample_to_pb, work_from_pb

log = logging.getLogger("streamrl.generator")

_CLOSE = object()


def _latency_points(points: list[tuple[int, float]]) -> list[pb.LatencyPoint]:
    return [pb.LatencyPoint(batch_size=b, seconds_per_step=s) for b, s in points]


class GeneratorAgent:
    def __init__(self, engine: Engine, trainer_address: str, generator_id: str, pool: str,
                 metrics: ServiceMetrics, engine_type: str = "torch", relay: RelayServer | None = None,
                 channel_factory=None):
        self.engine = engine
        self.generator_id = generator_id
        self.pool = pool
        self.engine_type = engine_type
        self.metrics = metrics
        self.relay = relay
        # Opens an authenticated channel to the trainer or a relay peer (streamrl.security).
        self._channel_factory = channel_factory or (lambda addr: grpc.insecure_channel(addr, options=GRPC_OPTIONS))
        self.channel = self._channel_factory(trainer_address)
        self.stub = rollout_pb2_grpc.RolloutStub(self.channel)
        self._weights = WeightSource(self.channel)
        self._outbox: queue.Queue = queue.Queue()
        self._fetching: set[int] = set()
        self.connected = threading.Event()
        self._stopping = threading.Event()
        self._draining = threading.Event()
        self.drain_timeout_s = 120.0
        """A drain that takes longer stops at once (the trainer re-dispatches what is left)."""
        self.report_interval_s = 0.5
        self.worker = Worker(engine, generator_id, metrics, on_sample=self._send_sample,
                             on_loaded=self._send_loaded, waiting_weights=lambda: bool(self._fetching))
        self.exit_code = 0

    # ---- outgoing -------------------------------------------------------------------
    def _requests(self):
        yield pb.ConnectRequest(hello=pb.Hello(
            generator_id=self.generator_id, pool=self.pool, capacity=self.engine.stats().capacity,
            engine=self.engine_type, policy_version=self.engine.policy_version,
            weights_address=self.relay.address if self.relay else "",
            latency_profile=_latency_points(self.engine.latency_profile()),
        ))
        while True:
            msg = self._outbox.get()
            if msg is _CLOSE:
                return
            yield msg

    def _send_sample(self, sample) -> None:
        self._outbox.put(pb.ConnectRequest(sample=sample_to_pb(sample)))

    def _send_loaded(self, msg: LoadWeights, sync_s: float) -> None:
        self._outbox.put(pb.ConnectRequest(weights_loaded=pb.WeightsLoaded(
            policy_version=msg.policy_version, sync_s=sync_s, size_bytes=msg.size_bytes, source=msg.source)))

    def _report_load(self, interval_s: float) -> None:
        last_tokens, last_t = 0, time.monotonic()
        while not self._stopping.wait(interval_s):
            st = self.engine.stats()
            now = time.monotonic()
            rate = (st.num_generated_tokens - last_tokens) / (now - last_t)
            last_tokens, last_t = st.num_generated_tokens, now
            self._outbox.put(pb.ConnectRequest(load=pb.LoadReport(
                num_running=st.num_running, num_waiting=st.num_waiting,
                num_generated_tokens=st.num_generated_tokens, tokens_per_s=rate,
                latency_profile=_latency_points(self.engine.latency_profile()),
                skewness_bubble_s=self.worker.skewness_bubble_s)))

    # ---- incoming -------------------------------------------------------------------
    def _read(self, responses) -> None:
        try:
            for resp in responses:
                kind = resp.WhichOneof("kind")
                if kind == "welcome":
                    self.connected.set()
                    log.info("connected to trainer run %s (v%d)", resp.welcome.run_id, resp.welcome.policy_version)
                elif kind == "assign":
                    self.worker.inbox.put(work_from_pb(resp.assign))
                elif kind == "cancel":
                    self.worker.inbox.put(Cancel(tuple(resp.cancel.prompt_ids)))
                elif kind == "new_weights":
                    self._start_fetch(notice_from_pb(resp.new_weights))
                elif kind == "configure":
                    self.worker.inbox.put(SetBatchCap(resp.configure.max_batch_size))
            log.info("drained: the trainer has every sample this replica held" if self._draining.is_set()
                     else "trainer closed the stream")
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                log.error("stream to trainer failed: %s %s", err.code().name, err.details())
                self.exit_code = 1
        finally:
            self._stopping.set()
            self.worker.stop()

    def _fetch(self, notice: WeightsNotice) -> tuple[bytes, str]:
        """The version's bytes from the named peer, or from the trainer when there is none
        or it fails; returns (blob, "peer" | "trainer")."""
        if notice.source:
            channel = self._channel_factory(notice.source)
            try:
                return fetch_blob(WeightSource(channel), notice, max_attempts=2, stopping=self._stopping), "peer"
            except grpc.RpcError as err:
                if self._stopping.is_set():
                    raise
                log.warning("peer %s could not serve v%d (%s); fetching from the trainer", notice.source,
                            notice.policy_version, err.code().name)
            finally:
                channel.close()
        return fetch_blob(self._weights, notice, stopping=self._stopping), "trainer"

    def _start_fetch(self, notice: WeightsNotice) -> None:
        if notice.policy_version <= self.engine.policy_version or notice.policy_version in self._fetching:
            return
        self._fetching.add(notice.policy_version)
        t0 = time.monotonic()

        def run():
            try:
                blob, source = self._fetch(notice)
                if self.relay:
                    self.relay.hold(notice.policy_version, blob)
                self.metrics.weight_sync_bytes.labels(source).inc(len(blob))
                self.metrics.weight_fetch_seconds.labels(source).observe(time.monotonic() - t0)
                self.worker.inbox.put(LoadWeights(notice.policy_version, deserialize(blob), t0, len(blob), source))
            except (WeightsCorruptError, grpc.RpcError) as err:
                if not self._stopping.is_set():
                    log.error("weights v%d rejected, keeping v%d: %s", notice.policy_version,
                              self.engine.policy_version, err)
            finally:
                self._fetching.discard(notice.policy_version)

        threading.Thread(target=run, name=f"fetch-v{notice.policy_version}", daemon=True).start()

    # ---- lifecycle ------------------------------------------------------------------
    def run(self, connect_timeout_s: float = 60.0) -> int:
        """Connect and serve until the trainer closes the stream or stop() is called."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=connect_timeout_s)
        except grpc.FutureTimeoutError:
            log.error("trainer unreachable after %.0fs", connect_timeout_s)
            return 1
        if self.relay:
            self.relay.start()
        capacity = self.engine.stats().capacity
        self.engine.measure_latency([1 << k for k in range(capacity.bit_length())] + [capacity])
        responses = self.stub.Connect(self._requests())
        reader = threading.Thread(target=self._read, args=(responses,), name="reader", daemon=True)
        reader.start()
        threading.Thread(target=self._report_load, args=(self.report_interval_s,), name="load", daemon=True).start()
        self.worker.run()
        self._stopping.set()
        self._outbox.put(_CLOSE)
        if self._draining.is_set():  # let the last samples reach the trainer and its stream end
            reader.join(timeout=10)
        responses.cancel()
        reader.join(timeout=5)
        self.channel.close()
        if self.relay:
            self.relay.stop()
        return self.exit_code

    def stop(self) -> None:
        self._stopping.set()
        self.worker.stop()

    def drain(self, reason: str = "") -> None:
        """Leave gracefully: tell the trainer to assign nothing more, finish what is held,
        then close (a second call, or drain_timeout_s, stops at once)."""
        if self._draining.is_set():
            self.stop()
            return
        self._draining.set()
        log.info("draining (%s): finishing the samples this replica holds", reason or "asked")
        # The trainer ends the stream once every sample assigned here has arrived (assignments
        # still on the wire included); then this replica exits.
        self._outbox.put(pb.ConnectRequest(draining=pb.Draining(reason=reason)))
        timer = threading.Timer(self.drain_timeout_s, self.stop)
        timer.daemon = True
        timer.start()
