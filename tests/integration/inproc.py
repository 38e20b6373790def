"""A trainer's gRPC side (coordinator + servicer + weight store) on its own event-loop
thread, for tests that drive it directly rather than through the RL loop."""

from __future__ import annotations

import asyncio
import threading

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from streamrl.metrics import ServiceMetrics
from streamrl.samples import WeightsNotice
from streamrl.security import add_port, server_interceptors
from streamrl.spec import SecuritySpec
from streamrl.trainer.coordinator import Coordinator, SamplingConfig
from streamrl.trainer.servicer import RolloutServicer
from streamrl.transfer import rollout_handler
from streamrl.weights import WeightStore
from streamrl.wire import GRPC_OPTIONS


class TrainerServer:
    def __init__(self, store: WeightStore, relay_pools: frozenset[str] = frozenset(),
                 security: SecuritySpec | None = None):
        self.store = store
        self.relay_pools = relay_pools
        self.security = security or SecuritySpec()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.call(self._start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self):
        self.coordinator = Coordinator(SamplingConfig(1.0, 1.0, 8, 0), lambda s, a: 0.0, ServiceMetrics("trainer"),
                                       relay_pools=self.relay_pools)
        self.server = grpc.aio.server(options=GRPC_OPTIONS,
                                      interceptors=server_interceptors(self.security, aio=True))
        self.server.add_generic_rpc_handlers((rollout_handler(RolloutServicer(self.coordinator, self.store, "run")),))
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, self.server)
        self.port = add_port(self.server, "127.0.0.1:0", self.security)
        await self.server.start()

    def publish(self, policy_version: int, tensors) -> WeightsNotice:
        version = self.store.publish(policy_version, tensors)
        notice = WeightsNotice(version.policy_version, version.size_bytes, version.num_chunks, version.sha256)

        async def announce():
            self.coordinator.announce_weights(notice)

        self.call(announce())
        return notice

    def num_connected(self) -> int:
        async def count():
            return len(self.coordinator.generators)

        return self.call(count())

    def stop(self):
        async def close():
            self.coordinator.close()
            await self.server.stop(0)

        self.call(close())
        self.loop.call_soon_threadsafe(self.loop.stop)
