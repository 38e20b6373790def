"""`streamrl run` of the tiny job with `engine.type: vllm` (vLLM's CPU build): the generator
boots from the trainer on dummy weights, loads every version in place, and the job learns with
every sample trained once within the staleness bound."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from streamrl.records import RunSummary
from tests.conftest import child_env

ITERATIONS, PROMPTS, GROUP, WINDOW = 20, 64, 8, 5
ENGINE = {"type": "vllm", "device": "cpu", "maxNumSeqs": 64, "enforceEager": True, "cpuKvCacheGib": 0.5}


@pytest.mark.slow
def test_stream_async_on_vllm_learns_and_trains_every_sample_once(write_job, tmp_path):
    job = write_job({"spec": {
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": PROMPTS, "groupSize": GROUP,
                      "learningRate": 3.0e-4},
        "pipeline": {"mode": "stream-async"},
        "generators": {"pools": [{"name": "default", "replicas": 1, "engine": ENGINE}]},
    }})
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"],
                          env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    log = (out / "logs" / "generator-default-0.log").read_text()
    assert "(pool default, vllm engine, batch 64)" in log
    assert "load_format=dummy" in log  # booted from the trainer: no weights until the first version

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in records] == list(range(1, ITERATIONS + 1))
    assert max(r["staleness_max"] for r in records) <= 1
    first = sum(r["reward_mean"] for r in records[:WINDOW]) / WINDOW
    last = sum(r["reward_mean"] for r in records[-WINDOW:]) / WINDOW
    assert last - first >= 0.05, f"reward {first:.3f} -> {last:.3f}"

    summary = RunSummary.read(out / "summary.json")
    assert summary.num_iterations == ITERATIONS
    assert summary.num_samples_accepted == ITERATIONS * PROMPTS * GROUP  # each sample once
    assert summary.num_samples_duplicate_dropped == 0
    assert summary.num_samples_stale_dropped == 0
