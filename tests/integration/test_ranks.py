"""The trainer's ranks on real torch.distributed (gloo): the same scored groups trained by
one rank and by two FSDP2-sharded ranks, with and without each memory feature (activation
checkpointing, CPU offload of the shards and optimizer state, each layer split over both ranks
by tensor parallelism on a 2-D mesh), give the same parameters and
the same published weights after three optimizer steps, and what is published is exactly the
shards put together."""

from __future__ import annotations

import os
import random
import socket

import pytest
import torch
import torch.multiprocessing as mp

from streamrl.models import load_model
from streamrl.samples import Group, Sample, ScoredSample
from streamrl.spec import AlgorithmSpec, TrainerMemorySpec
from streamrl.trainer.learner import Learner
from streamrl.trainer.ranks import Ranks

STEPS = 3


def _groups(step: int) -> list[list[Group]]:
    """Two arrivals of groups per step (as streamed), with long-tailed completion lengths."""
    rng = random.Random(step)
    arrivals = []
    for part in range(2):
        groups = []
        for g in range(3):
            samples = []
            for i in range(4):
                n = rng.choice([2, 3, 4, 5, 30])
                completion = tuple(rng.randrange(4, 40) for _ in range(n))
                logprobs = tuple(-rng.random() * 3 for _ in range(n))
                samples.append(ScoredSample(Sample(f"{step}-{part}-{g}", i, completion, logprobs, step, "stop"),
                                            rng.random(), rng.uniform(-1, 1)))
            groups.append(Group(f"{step}-{part}-{g}", step, g, (1, *[rng.randrange(4, 40) for _ in range(6)]),
                                tuple(samples)))
        arrivals.append(groups)
    return arrivals


def _train(rank: int, world_size: int, port: int, model_dir: str, out: str, memory: dict, algo: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ranks = Ranks.from_environment(timeout_s=60)
    learner = Learner(load_model(model_dir), AlgorithmSpec(microBatchSize=4, learningRate=1e-3, **algo), ranks=ranks,
                      memory=TrainerMemorySpec.model_validate(memory))
    if not ranks.is_leader:
        learner.follow()
        _full_parameters(learner)  # the checks below are collectives too
        _full_parameters(learner, critic=True)
        ranks.close()
        return
    stats = []
    for step in range(STEPS):
        arrivals = _groups(step)
        total = sum(g.num_samples for groups in arrivals for g in groups)
        for groups in arrivals:
            learner.accumulate(groups, total)
        stats.append(learner.step())
    weights = learner.weights()
    learner.stop()
    # the features asked for are in force: each layer recomputed, each unit's shards offloaded
    layers = list(learner.model.model.layers)
    assert all(layer.gradient_checkpointing for layer in layers) == bool(memory.get("activationCheckpointing"))
    if world_size > 1:
        units = [*layers, learner.model]
        policies = {type(m._get_fsdp_state()._fsdp_param_group.offload_policy).__name__ for m in units}
        assert policies == {"CPUOffloadPolicy" if memory.get("cpuOffload") else "OffloadPolicy"}
    # tensor-parallel: each rank holds a layer's projections split over the 2-D mesh's second dimension
    q = layers[0].self_attn.q_proj.weight
    tp = memory.get("tensorParallel", 1)
    assert (q.device_mesh.mesh_dim_names == ("dp", "tp")) == (tp > 1) if hasattr(q, "device_mesh") else tp == 1
    if tp > 1:
        assert q.to_local().shape[0] == q.shape[0] // tp
    # What is published is what the shards hold, put together.
    for name, full in _full_parameters(learner).items():
        assert torch.equal(weights[name], full), name
    critic = _full_parameters(learner, critic=True)
    torch.save({"weights": weights, "critic": critic, "loss": [s.loss for s in stats],
                "value_loss": [s.value_loss for s in stats], "samples": [s.num_samples for s in stats]}, out)
    ranks.close()


def _full_parameters(learner: Learner, critic: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter of the policy (or the critic) put together from the ranks' shards (a
    collective on every rank; {} for a learner without a critic)."""
    module = learner.critic if critic else learner.model
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
            for name, p in (module.named_parameters() if module is not None else ())}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trained(world_size: int, memory: dict, model_dir, out, algo: dict | None = None) -> dict:
    mp.spawn(_train, args=(world_size, _free_port(), str(model_dir), str(out), memory, algo or {}),
             nprocs=world_size, join=True)
    return torch.load(out)


@pytest.fixture(scope="module")
def one_plain_rank(tiny_model_dir, tmp_path_factory) -> dict:
    """What one rank without any memory feature trains: the reference."""
    return _trained(1, {}, tiny_model_dir, tmp_path_factory.mktemp("plain") / "ws1.pt")


@pytest.mark.slow
@pytest.mark.parametrize("world_size, memory", [
    (2, {}),
    (1, {"activationCheckpointing": True}),
    (2, {"cpuOffload": True}),
    (2, {"activationCheckpointing": True, "cpuOffload": True}),
    (2, {"tensorParallel": 2}),
    (2, {"tensorParallel": 2, "activationCheckpointing": True}),
    (2, {"tensorParallel": 2, "cpuOffload": True}),
], ids=["sharded", "checkpointed", "sharded-offloaded", "sharded-checkpointed-offloaded", "tensor-parallel",
        "tensor-parallel-checkpointed", "tensor-parallel-offloaded"])
def test_sharding_and_memory_features_train_the_same_parameters_as_one_plain_rank(
        one_plain_rank, tiny_model_dir, tmp_path, world_size, memory):
    one, other = one_plain_rank, _trained(world_size, memory, tiny_model_dir, tmp_path / "other.pt")
    assert one["samples"] == other["samples"] == [24] * STEPS
    assert one["loss"] == pytest.approx(other["loss"], rel=1e-4)
    initial = dict(load_model(tiny_model_dir).named_parameters())
    assert one["weights"].keys() == other["weights"].keys() == initial.keys()  # tied weights once
    for name, weight in one["weights"].items():
        assert not torch.equal(weight, initial[name].detach()) or "norm" in name  # they trained
        torch.testing.assert_close(other["weights"][name], weight, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("memory", [{}, {"tensorParallel": 2}], ids=["sharded", "tensor-parallel"])
def test_ppo_on_two_sharded_ranks_trains_the_policy_and_the_critic_as_one_rank(tiny_model_dir, tmp_path, memory):
    algo = {"type": "ppo", "criticLearningRate": 5e-3}
    one, two = (_trained(n, memory if n == 2 else {}, tiny_model_dir, tmp_path / f"ppo-{n}.pt", algo) for n in (1, 2))
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-4)
    assert one["value_loss"] == pytest.approx(two["value_loss"], rel=1e-4) and one["value_loss"][0] > 0
    initial = load_model(tiny_model_dir)
    assert one["critic"].keys() == two["critic"].keys() == \
        {f"model.{k}" for k, _ in initial.get_decoder().named_parameters()} | {"value_head.weight", "value_head.bias"}
    assert torch.count_nonzero(one["critic"]["value_head.weight"]) > 0  # it learnt from 0
    # the critic's learning rate, 5x the policy's, magnifies the ranks' different summation
    # order: ~1e-6 on weights of ~0.1 after three steps
    for part, atol in (("weights", 1e-6), ("critic", 1e-5)):
        for name, weight in one[part].items():
            torch.testing.assert_close(two[part][name], weight, rtol=1e-5, atol=atol, msg=f"{part} {name}")
