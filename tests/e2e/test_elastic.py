"""Elastic generators in a local run (autoscaling.mode Internal), with the run's own real
Prometheus as the policy's only input.

The task is a two-epoch length curriculum: each epoch walks one-number answers to long
prompts first (training-bound), then long answers (generation-bound). On the long stretch
replicas are added, one at a time; when the second epoch starts training-bound again, the
generators are spare by the policy's own numbers and one is removed (drained), and nothing
flaps. Replica-seconds match the processes' lives as the process table saw them, each
replica's time to join is recorded, and every sample is accepted exactly once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from streamrl.local.prometheus import LocalPrometheus
from streamrl.scaling.policy import count_flaps
from tests.conftest import child_env
from tests.processwatch import ProcessWatch

REVERSAL_WINDOW_S = 30.0
"""Going there and back again within this long is a flap (the rounds here are one second)."""

SHORT, LONG = 240, 192
"""Prompts per epoch: long prompts with a one-number answer (generating one is a prefill and a
couple of decode steps, training on it a forward and backward pass over the whole prompt:
the generators are spare by the policy's own numbers), and short prompts with answers of
21-31 numbers (generation-bound)."""
PADDING = "." * 100
"""What makes the first kind of prompt long (the warm start learns to read past it)."""
PROMPTS, GROUP = 8, 8
ITERATIONS = (SHORT + LONG + SHORT) // PROMPTS  # one epoch, then the next one's short stretch


def _curriculum(path, seed: int = 0) -> None:
    import random

    rng = random.Random(seed)
    lines = []
    for i in range(SHORT + LONG):
        span = 0 if i < SHORT else rng.randint(20, 30)
        a = rng.randint(0, 99 - span)
        lines.append(json.dumps({"prompt": f"{PADDING if i < SHORT else ''}{a}..{a + span}:",
                                 "answer": " ".join(map(str, range(a, a + span + 1)))}))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_generators_scale_up_one_at_a_time_and_down_without_losing_work(write_job, tmp_path):
    _curriculum(tmp_path / "curriculum.jsonl")
    job = write_job({"spec": {
        "task": {"name": "jsonl", "path": str(tmp_path / "curriculum.jsonl"), "curriculum": True},
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": PROMPTS, "groupSize": GROUP,
                      "learningRate": 1.0e-5},
        "pipeline": {"mode": "stream-async"},
        "generators": {"pools": [{"name": "default", "replicas": 1, "minReplicas": 1, "maxReplicas": 3,
                                  "engine": {"type": "torch", "maxBatchSize": 2}}]},
        # The cooldown keeps a removal away from the scale-ups of the first epoch.
        "autoscaling": {"mode": "Internal", "intervalSeconds": 1, "minUtilisation": 0.5,
                        "cooldownSeconds": 15, "behavior": {
            "scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 2}]},
            # At most one removal in the short stretch, so the run ends above where it began.
            "scaleDown": {"stabilizationWindowSeconds": 1, "policies": [{"type": "Pods", "value": 1,
                                                                         "periodSeconds": 600}]}}},
    }})
    out = tmp_path / "run"
    with ProcessWatch(f"streamrl.cli generator {out}/") as watch:
        run = subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet",
                              "--cores", "3"], env=child_env(), capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]

    rounds = [json.loads(line) for line in (out / "autoscaling.jsonl").read_text().splitlines()]
    changes = [r for r in rounds if r["step"]]
    ups, downs = [r for r in changes if r["step"] > 0], [r for r in changes if r["step"] < 0]
    # The removal comes when the second epoch starts training-bound; the scale-down policy
    # allows one in the run.
    assert len(ups) >= 2 and len(downs) == 1, [r["reason"] for r in changes]
    # One at a time: each change moves one replica, and the next comes only after the
    # previous one joined (or left) and was measured.
    total = 1
    for i, r in enumerate(rounds):
        if r["step"]:
            assert sum(r["replicas"].values()) == total + r["step"]
            total += r["step"]
            later = rounds[i + 1:]
            nxt = next((j for j, x in enumerate(later) if x["step"]), len(later))
            # (A replica forked from the run's zygote may join within a round: then the wait is
            # only the measuring.)
            assert any(x["reason"].startswith(("waiting for replicas to join or leave", "measuring since the last"))
                       for x in later[:nxt]) or nxt == len(later)
    # No flap: the replicas never went there and back again (add -> remove -> add) in the window.
    assert count_flaps([(r["time_unix"], r["step"]) for r in changes], REVERSAL_WINDOW_S) == 0, \
        [(round(r["time_unix"] - rounds[0]["time_unix"], 1), r["step"], r["reason"]) for r in changes]
    for r in ups:  # added after generation-bound iterations, by the rule's own numbers
        assert r["reason"].startswith("generation-bound") and r["generation_s"] > r["train_s"]
    assert downs[0]["generation_s"] <= downs[0]["train_s"]  # never while generation-bound
    assert all(d["time_unix"] - u["time_unix"] >= 15 for d in downs for u in ups if u["time_unix"] < d["time_unix"])

    local = json.loads((out / "run.json").read_text())  # the runner's record; the trainer's is summary.json
    assert local["autoscaling"]["scale_ups"] == len(ups) and local["autoscaling"]["scale_downs"] == 1
    assert local["autoscaling"]["replicas_final"]["default"] == 1 + len(ups) - len(downs) > 1  # ends with more
    assert local["generator_replicas_started"] == 1 + len(ups)
    # Replica-seconds are the replicas' lives as the process table saw them, the drained one
    # counted to its exit (not to the run's end).
    lifetimes = watch.lifetimes_s()
    assert len(lifetimes) == local["generator_replicas_started"]
    assert abs(local["generator_replica_seconds"] - sum(lifetimes.values())) < 1.0, (local, lifetimes)
    summary = json.loads((out / "summary.json").read_text())
    # Every prompt accounted for exactly once, across scale-ups and the drain.
    assert summary["num_iterations"] == ITERATIONS
    assert summary["num_samples_accepted"] == ITERATIONS * PROMPTS * GROUP
    assert summary["num_samples_duplicate_dropped"] == 0
    assert summary["num_samples_redispatched"] == 0
    # Each replica's time to join: process start, then its Hello, then its first sample.
    joins = summary["generator_joins"]
    assert len(joins) == local["generator_replicas_started"]
    assert all(0 < j["startup_s"] < j["join_s"] < 180 for j in joins), joins
    drained = [p for p in (out / "logs").glob("generator-*.log")
               if "drained: the trainer has every sample this replica held" in p.read_text()]
    assert len(drained) == 1
    assert "warning" not in run.stderr.lower()

    # The run's Prometheus saw the same decisions (the autoscaler's own metrics).
    shutil.copytree(out / "prometheus" / "data", tmp_path / "prom" / "data")
    prom = LocalPrometheus(tmp_path / "prom", rules=None)
    prom.start()
    try:
        at = rounds[-1]["time_unix"]
        got = {r["metric"]["direction"]: float(r["value"][1])
               for r in prom.query('max by (direction) (streamrl_autoscaler_decisions_total{rljob="tiny-counting"})',
                                   at=at)}
        assert got == {"up": len(ups), "down": 1.0}
        [desired] = prom.query('streamrl_autoscaler_desired_replicas{rljob="tiny-counting", pool="default"}', at=at)
        assert float(desired["value"][1]) == local["autoscaling"]["replicas_final"]["default"]
    finally:
        prom.stop()
