"""Each rank of a two-rank FSDP2 learner (gloo) times its own work onto its own metrics:
forward/backward per micro-batch (the same number on both ranks), the forward all-gathers
through FSDP2's hooks, the optimizer step, the control group and the weight gather."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from streamrl.metrics import ServiceMetrics
from streamrl.models import load_model
from streamrl.samples import Group, Sample, ScoredSample
from streamrl.spec import AlgorithmSpec
from streamrl.trainer.learner import Learner
from streamrl.trainer.ranks import Ranks

KINDS = ("forward_all_gather", "optimizer_step", "scatter", "all_reduce", "gather_weights")


def _groups() -> list[Group]:
    groups = []
    for g in range(3):
        samples = tuple(ScoredSample(Sample(f"p{g}", i, (7, 8, 9, 2)[: 2 + i % 3], (-1.0,) * (2 + i % 3), 0, "stop"),
                                     0.5, 1.0 - i / 2) for i in range(4))
        groups.append(Group(f"p{g}", 0, g, (1, 5, 6, 7), samples))
    return groups


def _run(rank: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ranks = Ranks.from_environment(timeout_s=60)
    metrics = ServiceMetrics("trainer")
    learner = Learner(load_model(model_dir), AlgorithmSpec(microBatchSize=2, learningRate=1e-3), ranks=ranks,
                      metrics=metrics)
    if ranks.is_leader:
        for _ in range(2):
            learner.accumulate(_groups(), 12)
            learner.step()
            learner.weights()
        learner.stop()
    else:
        learner.follow()
    r = str(rank)
    value = metrics.registry.get_sample_value
    result = {
        "count": value("streamrl_trainer_forward_backward_seconds_count", {"rank": r}),
        "sum": value("streamrl_trainer_forward_backward_seconds_sum", {"rank": r}),
        "info": value("streamrl_trainer_rank_info", {"rank": r, "world_size": "2"}),
        **{kind: value("streamrl_trainer_collective_seconds_total", {"rank": r, "kind": kind}) for kind in KINDS},
    }
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    ranks.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_each_rank_times_its_micro_batches_and_collectives(tiny_model_dir, tmp_path):
    out = str(tmp_path / "timings")
    mp.spawn(_run, args=(_free_port(), str(tiny_model_dir), out), nprocs=2, join=True)
    leader, follower = (json.loads(open(f"{out}.{rank}").read()) for rank in (0, 1))
    # 12 samples a step over 2 ranks, 2 a micro-batch: 3 micro-batches each, 2 steps.
    assert leader["count"] == follower["count"] == 6
    assert leader["info"] == follower["info"] == 1
    for timings in (leader, follower):
        assert timings["sum"] > 0
        for kind in ("forward_all_gather", "optimizer_step", "all_reduce", "gather_weights"):
            assert timings[kind] > 0, kind
        # The forward's all-gathers happen inside forward/backward.
        assert timings["forward_all_gather"] < timings["sum"]
    assert leader["scatter"] > 0
    assert follower["scatter"] == 0  # it receives: that wait is its waiting_leader idle time
