"""Weights across an emulated slow inter-datacenter link: one copy per version crosses it."""

from __future__ import annotations

import time

import pytest
import torch

from streamrl.generator.agent import GeneratorAgent
from streamrl.generator.relay import Relay
from streamrl.generator.torch_engine import TorchEngine
from streamrl.metrics import ServiceMetrics
from streamrl.models import load_model
from streamrl.weights import WeightStore
from tests.integration.inproc import AgentThread, TrainerServer
from tests.linkproxy import LinkProxy

NUM_REMOTE = 3


def _start_agents(tiny_model_dir, address: str, relay: bool, n: int):
    agents = []
    for i in range(n):
        engine = TorchEngine(load_model(tiny_model_dir), 2, eos_token_id=2)
        agent = GeneratorAgent(engine, address, f"remote-{i}", "remote", ServiceMetrics("generator"),
                               relay=Relay(2, 64 * 1024) if relay else None)
        agents.append(AgentThread(agent))
    return agents


def _new_weights(tiny_model_dir, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v.detach() + 0.01 * torch.randn(v.shape, generator=g)
            for k, v in load_model(tiny_model_dir).named_parameters()}


def _wait(cond, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("relay, copies", [(True, 1), (False, NUM_REMOTE)])
def test_bytes_over_the_slow_link_per_version(tiny_model_dir, relay, copies):
    trainer = TrainerServer(WeightStore(2, 64 * 1024), relay_pools=frozenset({"remote"}) if relay else frozenset())
    link = LinkProxy("127.0.0.1", trainer.port, bandwidth_mbps=400, latency_ms=5).start()
    agents = _start_agents(tiny_model_dir, link.address, relay, NUM_REMOTE)
    try:
        _wait(lambda: trainer.num_connected() == NUM_REMOTE)
        for v in (1, 2, 3):
            before = link.bytes["down"]
            tensors = _new_weights(tiny_model_dir, v)
            notice = trainer.publish(v, tensors)
            _wait(lambda v=v: all(a.agent.engine.policy_version == v for a in agents))
            crossed = link.bytes["down"] - before
            assert crossed == pytest.approx(copies * notice.size_bytes, rel=0.05), (v, crossed, notice.size_bytes)
            for a in agents:  # every replica runs exactly the published tensors
                params = dict(a.agent.engine.model.named_parameters())
                assert all(torch.equal(params[k], t) for k, t in tensors.items())
    finally:
        for a in agents:
            a.stop()
        trainer.stop()
        link.stop()
