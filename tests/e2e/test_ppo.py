"""`streamrl run` with `algorithm.type: ppo` on the tiny task, one trainer rank and two (FSDP2
over gloo): the reward rises as under grpo, every sample is accepted once, the critic's loss
is recorded per iteration, and the run's checkpoint holds the critic and its optimizer. (That
the critic learns its returns is tests/unit/trainer/test_critic.py's: here the returns move
as the policy learns.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamrl.records import IterationRecord, RunSummary, TrainerPhase
from tests.conftest import child_env

pytestmark = pytest.mark.slow

ITERATIONS, SAMPLES = 15, 128


@pytest.mark.parametrize("ranks, group", [(1, 8), (2, 8), (1, 1)], ids=["one-rank", "two-ranks", "one-sample-groups"])
def test_ppo_learns_with_a_critic_on_one_rank_and_two(write_job, tmp_path, ranks, group):
    """Groups of one sample too: the critic, not the group, is each sample's baseline."""
    job = write_job({"spec": {
        "algorithm": {"type": "ppo", "numIterations": ITERATIONS, "promptsPerStep": SAMPLES // group,
                      "groupSize": group, "criticLearningRate": 1e-3},
        "pipeline": {"mode": "stream-sync"},
        "trainer": {"processesPerNode": ranks, "processGroupTimeoutSeconds": 60},
    }})
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"],
                          env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == TrainerPhase.SUCCEEDED and summary.num_iterations == ITERATIONS
    assert summary.num_samples_accepted == ITERATIONS * SAMPLES  # each sample once
    records = IterationRecord.read_lines(out / "metrics.jsonl")
    # The first iteration's reward is the untrained policy's; the last five's mean what it learnt.
    learnt = sum(r.reward_mean for r in records[-5:]) / 5
    assert learnt - records[0].reward_mean >= 0.05, [round(r.reward_mean, 3) for r in records]
    assert all(r.value_loss > 0 for r in records)
    checkpoints = sorted((out / "checkpoints").glob("*/.metadata"))
    assert checkpoints, sorted(p.name for p in out.iterdir())
    import torch.distributed.checkpoint as dcp

    keys = dcp.FileSystemReader(str(checkpoints[-1].parent)).read_metadata().state_dict_metadata
    assert any(k.startswith("critic.") for k in keys) and any(k.startswith("critic_optimizer.") for k in keys)
