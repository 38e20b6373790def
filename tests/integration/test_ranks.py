"""The trainer's ranks on real torch.distributed (gloo): the same scored groups trained by
one rank and by two FSDP2-sharded ranks give the same parameters and the same published
weights after three optimizer steps, and what is published is exactly the shards put
together."""

from __future__ import annotations

import os
import random
import socket

import pytest
import torch
import torch.multiprocessing as mp

from streamrl.models import load_model
from streamrl.samples import Group, Sample, ScoredSample
from streamrl.spec import AlgorithmSpec
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


def _train(rank: int, world_size: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ranks = Ranks.from_environment(timeout_s=60)
    learner = Learner(load_model(model_dir), AlgorithmSpec(microBatchSize=4, learningRate=1e-3), ranks=ranks)
    if not ranks.is_leader:
        learner.follow()
        _full_parameters(learner)  # the check below is a collective too
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
    # What is published is what the shards hold, put together.
    for name, full in _full_parameters(learner).items():
        assert torch.equal(weights[name], full), name
    torch.save({"weights": weights, "loss": [s.loss for s in stats], "samples": [s.num_samples for s in stats]}, out)
    ranks.close()


def _full_parameters(learner: Learner) -> dict[str, torch.Tensor]:
    """Every parameter put together from the ranks' shards (a collective on every rank)."""
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
            for name, p in learner.model.named_parameters()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_one_rank_and_two_sharded_ranks_train_the_same_parameters(tiny_model_dir, tmp_path):
    results = {}
    for world_size in (1, 2):
        out = str(tmp_path / f"ws{world_size}.pt")
        mp.spawn(_train, args=(world_size, _free_port(), str(tiny_model_dir), out), nprocs=world_size, join=True)
        results[world_size] = torch.load(out)
    one, two = results[1], results[2]
    assert one["samples"] == two["samples"] == [24] * STEPS
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-4)
    initial = dict(load_model(tiny_model_dir).named_parameters())
    assert one["weights"].keys() == two["weights"].keys() == initial.keys()  # tied weights once
    for name, weight in one["weights"].items():
        assert not torch.equal(weight, initial[name].detach()) or "norm" in name  # they trained
        torch.testing.assert_close(two["weights"][name], weight, rtol=1e-5, atol=1e-6, msg=name)
