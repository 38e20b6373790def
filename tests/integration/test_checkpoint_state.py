"""Checkpoints restore the learner exactly: on 1 rank, on 2 FSDP2 ranks (gloo) and on 2
tensor-parallel ranks (a 1 x 2 mesh), under grpo and under ppo (whose checkpoints hold the
critic and its optimizer too), saving after two steps, loading (into the same learner, and
into a fresh one as a restarted trainer would) and taking a third step on the same groups
gives parameters and optimizer state bit-identical to taking that step without the save and
load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from streamrl.models import load_model
from streamrl.spec import AlgorithmSpec, TrainerMemorySpec
from streamrl.trainer.learner import Learner
from streamrl.trainer.ranks import Ranks, balance_by_tokens
from tests.integration.test_ranks import _free_port, _groups

ALGOS = {"grpo": AlgorithmSpec(microBatchSize=4, learningRate=1e-3, warmupSteps=3),
         "ppo": AlgorithmSpec(type="ppo", microBatchSize=4, learningRate=1e-3, warmupSteps=3,
                              criticLearningRate=5e-3)}


def _step(learner: Learner, step: int) -> None:
    """One optimizer step on step's groups, every rank taking its share as rank 0 would hand it."""
    arrivals = _groups(step)
    total = sum(g.num_samples for groups in arrivals for g in groups)
    groups_of_ranks = learner.data_parallel  # a tensor-parallel group's ranks take the same share
    for groups in arrivals:
        samples = [(g.prompt_token_ids, s) for g in groups for s in g.samples]
        shares = balance_by_tokens(samples, [len(p) + len(s.sample.completion_token_ids) for p, s in samples],
                                   groups_of_ranks)
        micro = max(-(-len(share) // learner.algo.micro_batch_size) for share in shares)
        learner._accumulate(shares[learner.ranks.rank // learner.tensor_parallel], total, micro)
    learner._step()


def _state(learner: Learner) -> dict[str, torch.Tensor]:
    """Every parameter and every optimizer state tensor, whole (a collective on every rank)."""
    def whole(t):
        return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()

    out = {}
    parts = [("", learner.model, learner.optimizer, learner.scheduler)]
    if learner.critic is not None:
        parts.append(("critic/", learner.critic, learner.critic_optimizer, learner.critic_scheduler))
    for prefix, model, optimizer, scheduler in parts:
        out |= {f"{prefix}param/{n}": whole(p) for n, p in model.named_parameters()}
        for i, p in enumerate(model.parameters()):
            for key, value in optimizer.state[p].items():
                out[f"{prefix}optim/{i}/{key}"] = whole(value)
        out[f"{prefix}lr"] = torch.tensor(scheduler.get_last_lr())
    out["version"] = torch.tensor(learner.policy_version)
    return out


def _run(rank: int, world_size: int, port: int, model_dir: str, ckpt: str, out: str, algo: str, tp: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ranks = Ranks.from_environment(timeout_s=60)
    memory = TrainerMemorySpec(tensorParallel=tp)
    learner = Learner(load_model(model_dir), ALGOS[algo], ranks=ranks, memory=memory)
    for step in range(2):
        _step(learner, step)
    saved = _state(learner)
    learner._save(Path(ckpt))
    learner.wait_saved()
    _step(learner, 2)  # the step taken straight on
    straight = _state(learner)
    learner._load(Path(ckpt))  # back to after two steps, in the same learner
    reloaded = _state(learner)
    _step(learner, 2)
    again = _state(learner)
    # a restarted trainer: initial weights, then load
    fresh = Learner(load_model(model_dir), ALGOS[algo], ranks=ranks, memory=memory)
    fresh._load(Path(ckpt))
    _step(fresh, 2)
    restarted = _state(fresh)
    if ranks.is_leader:
        torch.save({"saved": saved, "reloaded": reloaded, "straight": straight, "again": again,
                    "restarted": restarted}, out)
    ranks.close()


@pytest.mark.slow
@pytest.mark.parametrize("world_size, algo, tp", [(1, "grpo", 1), (2, "grpo", 1), (1, "ppo", 1), (2, "ppo", 1),
                                                  (2, "ppo", 2)])
def test_save_load_and_a_step_is_bit_identical_to_the_step_alone(tiny_model_dir, tmp_path, world_size, algo, tp):
    out = tmp_path / "states.pt"
    mp.spawn(_run, args=(world_size, _free_port(), str(tiny_model_dir), str(tmp_path / "ckpt"), str(out), algo, tp),
             nprocs=world_size, join=True)
    states = torch.load(out)
    saved, straight = states["saved"], states["straight"]
    assert int(saved["version"]) == 2 and int(straight["version"]) == 3
    assert any(not torch.equal(saved[k], straight[k]) for k in saved if k.startswith("optim/"))  # it moved
    critic = [k for k in saved if k.startswith("critic/")]
    assert bool(critic) == (algo == "ppo")
    if critic:  # the critic learnt too, and its state is in the checkpoint (compared below with the rest)
        assert any(not torch.equal(saved[k], straight[k]) for k in critic if k.startswith("critic/param/"))
    for name in ("reloaded",):
        for key, value in saved.items():
            assert torch.equal(states[name][key], value), (name, key)
    for name in ("again", "restarted"):
        assert states[name].keys() == straight.keys()
        for key, value in straight.items():
            assert torch.equal(states[name][key], value), (name, key)
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == sorted([".metadata", *[f"__{r}_0.distcp" for r in range(world_size)],
                            *[f"rank-{r}.pt" for r in range(world_size)]])
