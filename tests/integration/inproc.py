"""Services' gRPC sides in-process, for tests that drive them directly rather than through
the RL loop: a trainer's (coordinator + servicer + weight store) and generator agents (with
their relays), each on an event-loop thread of its own."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from streamrl.generator.agent import GeneratorAgent
from streamrl.generator.relay import Relay
from streamrl.messages import WeightsNotice
from streamrl.metrics import ServiceMetrics
from streamrl.rollout.work import SamplingConfig
from streamrl.spec import SecuritySpec
from streamrl.trainer.coordinator import Coordinator
from streamrl.trainer.groups import Scorer
from streamrl.trainer.servicer import RolloutServicer
from streamrl.weights import WeightStore
from streamrl.wire.channels import add_port, new_server, open_channel
from streamrl.wire.transfer import WeightSource, fetch_blob


class LoopThread:
    """An asyncio loop on a daemon thread; `call` runs a coroutine there and waits."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def submit(self, coro) -> futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro, timeout_s: float = 30):
        return self.submit(coro).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


class TrainerServer(LoopThread):
    def __init__(self, store: WeightStore, relay_pools: frozenset[str] = frozenset(),
                 security: SecuritySpec | None = None, vocab_size: int | None = None, port: int = 0,
                 sampling: SamplingConfig | None = None, scorer: Scorer | None = None):
        super().__init__()
        self.store = store
        self.port = port
        """Where it listens (0: a free port, chosen when it starts)."""
        self.relay_pools = relay_pools
        self.security = security or SecuritySpec()
        self.vocab_size = vocab_size
        self.sampling = sampling or SamplingConfig(1.0, 1.0, 8, 0)
        """How its work is sampled (default: temperature 1, at most 8 new tokens, seed 0)."""
        self.scorer = scorer or (lambda sample, answer: 0.0)
        """Each accepted sample's reward (default 0), called on the server's loop."""
        self.call(self._start())

    async def _start(self):
        """A coordinator of `sampling` and `scorer` (refusing ids beyond vocab_size when given)."""
        self.coordinator = Coordinator(self.sampling, self.scorer, ServiceMetrics("trainer"),
                                       relay_pools=self.relay_pools, vocab_size=self.vocab_size)
        self.server = new_server(self.security)
        self.server.add_generic_rpc_handlers((RolloutServicer(self.coordinator, self.store, "run").handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), self.server)
        self.port = add_port(self.server, f"127.0.0.1:{self.port}", self.security)
        await self.server.start()

    def publish(self, policy_version: int, tensors) -> WeightsNotice:
        version = self.store.publish(policy_version, tensors)
        notice = WeightsNotice(version.policy_version, version.size_bytes, version.num_chunks, version.sha256)

        async def announce():
            self.coordinator.announce(notice)

        self.call(announce())
        return notice

    def on_loop(self, fn):
        """fn() run on the server's loop (where the coordinator lives); its result."""
        async def run():
            return fn()

        return self.call(run())

    def num_connected(self) -> int:
        async def count():
            return len(self.coordinator.replicas)

        return self.call(count())

    def stop(self):
        async def close():
            self.coordinator.close()
            await self.server.stop(0)

        self.call(close())
        self.close()


async def serve_relay(relay: Relay, security: SecuritySpec) -> grpc.aio.Server:
    """Serve a relay on loopback as the generator process does (on its gRPC server)."""
    server = new_server(security)
    server.add_generic_rpc_handlers((relay.handler(),))
    relay.address = f"127.0.0.1:{add_port(server, '127.0.0.1:0', security)}"
    await server.start()
    return server


class RelayThread(LoopThread):
    """A relay alone, served on its own loop."""

    def __init__(self, relay: Relay, security: SecuritySpec | None = None):
        super().__init__()
        self.relay = relay
        self.server = self.call(serve_relay(relay, security or SecuritySpec()))
        self.port = int(relay.address.rsplit(":", 1)[1])

    def stop(self) -> None:
        self.call(self.server.stop(0))
        self.close()


class AgentThread(LoopThread):
    """A generator agent running on its own loop, its relay (if any) served there."""

    def __init__(self, agent: GeneratorAgent):
        super().__init__()
        self.agent = agent
        self.server = self.call(serve_relay(agent.relay, agent.security)) if agent.relay else None
        self.done = self.submit(agent.run())

    def stop(self, timeout_s: float = 30) -> int:
        self.agent.stop()
        code = self.done.result(timeout_s)
        self.close()
        return code


def fetch(address: str, notice: WeightsNotice, security: SecuritySpec | None = None, **options) -> bytes:
    """fetch_blob over a fresh asyncio channel, for synchronous tests."""
    async def go():
        async with open_channel(address, security or SecuritySpec()) as channel:
            return await fetch_blob(WeightSource(channel), notice, **options)

    return asyncio.run(go())
