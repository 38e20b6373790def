"""Weight delivery to real generator agents: a cut link resumes, a corrupt version is refused."""

from __future__ import annotations

import random
import time

import torch

from streamrl.generator.agent import GeneratorAgent
from streamrl.generator.relay import Relay
from streamrl.generator.torch_engine import TorchEngine
from streamrl.messages import WeightsNotice
from streamrl.metrics import ServiceMetrics
from streamrl.models import load_model
from streamrl.weights import WeightStore, WeightVersion, deserialize
from tests.integration.inproc import AgentThread, RelayThread, TrainerServer, fetch
from tests.linkproxy import LinkProxy


def _perturbed(model_dir, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v.detach() + 0.01 * torch.randn(v.shape, generator=g)
            for k, v in load_model(model_dir).named_parameters()}


def test_transfer_cut_at_a_random_chunk_resumes_with_identical_weights(tiny_model_dir, caplog):
    tensors = _perturbed(tiny_model_dir, 0)
    relay = RelayThread(Relay(2, 64 * 1024))
    version = WeightStore(1, 64 * 1024).publish(5, tensors)
    relay.relay.hold(version)
    cut = random.Random(7).randrange(version.size_bytes // 10, version.size_bytes * 9 // 10)
    link = LinkProxy("127.0.0.1", relay.port, cut_down_after=cut).start()
    try:
        notice = WeightsNotice(5, version.size_bytes, version.num_chunks, version.sha256)
        got = deserialize(fetch(link.address, notice, backoff_s=0.05))
        assert link.num_connections == 2  # the first was cut, the second resumed
        [broke_at] = [int(r.getMessage().split("at byte ")[1].split()[0]) for r in caplog.records
                      if "broke at byte" in r.getMessage()]
        # Resumed from the last verified chunk, not from zero: the second connection only
        # carried the rest (what gRPC had buffered past that chunk crossed twice).
        assert 0 < broke_at <= cut and broke_at % (64 * 1024) == 0
        assert link.bytes["down"] <= (cut + version.size_bytes - broke_at) * 1.05
        assert all(torch.equal(got[k], t) for k, t in tensors.items())
    finally:
        link.stop()
        relay.stop()


def test_generator_refuses_a_corrupt_version_and_keeps_serving_the_old_one(tiny_model_dir):
    trainer = TrainerServer(WeightStore(3, 64 * 1024))
    engine = TorchEngine(load_model(tiny_model_dir), 2, eos_token_id=2)
    agent = GeneratorAgent(engine, f"127.0.0.1:{trainer.port}", "g0", "default", ServiceMetrics("generator"))
    running = AgentThread(agent)
    try:
        deadline = time.monotonic() + 30
        while trainer.num_connected() < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        good = trainer.store.publish(1, _perturbed(tiny_model_dir, 1))
        bad_blob = bytearray(good.blob)
        bad_blob[len(bad_blob) // 2] ^= 0xFF
        # Version 2 on offer: its chunks are self-consistent but its bytes are not the published ones.
        forged = WeightVersion.build(2, bytes(bad_blob), 64 * 1024)
        trainer.store.add(forged)

        async def announce():
            trainer.coordinator.announce(WeightsNotice(2, forged.size_bytes, forged.num_chunks, good.sha256))

        trainer.call(announce())
        time.sleep(1.0)
        assert engine.policy_version == 0  # refused; the old weights stay in service
        assert not agent.fetcher.fetching
        tensors = _perturbed(tiny_model_dir, 3)
        trainer.publish(3, tensors)
        deadline = time.monotonic() + 30
        while engine.policy_version != 3:
            assert time.monotonic() < deadline, "the next good version never arrived"
            time.sleep(0.02)
        params = dict(engine.model.named_parameters())
        assert all(torch.equal(params[k], t) for k, t in tensors.items())
    finally:
        running.stop()
        trainer.stop()
