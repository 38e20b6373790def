"""A trainer's gRPC side (coordinator + servicer + weight store) on its own event-loop
thread, for tests that drive it directly rather than through the RL loop."""

from __future__ import annotations

import asyncio
import threading

import grpc

from streamrl.metrics import ServiceMetrics
from streamrl.samples import WeightsNotice
from streamrl.trainer.coordinator import Coordinator, SamplingConfig
from streamrl.trainer.servicer import RolloutServicer
from streamrl.v1 import rollout_pb2_grpc
from streamrl.weights import WeightStore
from streamrl.wire import GRPC_OPTIONS


class TrainerServer:
    def __init__(self, store: WeightStore, relay_pools: frozenset[str] = frozenset()):
        self.store = store
        self.relay_pools = relay_pools
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.call(self._start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self):
        self.coordinator = Coordinator(SamplingConfig(1.0, 1.0, 8, 0), lambda s, a: 0.0, ServiceMetrics("trainer"),
                                       relay_pools=self.relay_pools)
        self.server = grpc.aio.server(options=GRPC_OPTIONS)
        rollout_pb2_grpc.add_RolloutServicer_to_server(RolloutServicer(self.coordinator, self.store, "run"),
                                                       self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
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
