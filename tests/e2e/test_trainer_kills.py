"""Nothing lost when the trainer dies: `streamrl run` (stream-async, 2 generators) with its
trainer SIGKILLed twice at random iterations finishes; every iteration is in metrics.jsonl
once, the ledger has no prompt trained twice, none missing and no iteration short of its
batch; the generators were never restarted (they reconnected to each new trainer)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.records import IterationRecord, LocalRun, RunSummary, TrainerPhase
from tests.conftest import child_env

pytestmark = pytest.mark.slow

ITERATIONS, PROMPTS, GROUP = 30, 8, 4


def _trained(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _pids(pattern: str) -> set[int]:
    return {int(p) for p in subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()}


def test_two_trainer_kills_lose_nothing_and_train_nothing_twice(write_job, tmp_path):
    job = write_job({"spec": {
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": PROMPTS, "groupSize": GROUP},
        "pipeline": {"mode": "stream-async"},
        "generators": {"pools": [{"name": "default", "replicas": 2}]},
        "checkpoint": {"everyIterations": 4, "keep": 2},
    }})
    out = tmp_path / "run"
    run = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"],
                           env=child_env(), stderr=subprocess.PIPE, text=True)
    rng = random.Random()
    kills = sorted(rng.sample(range(5, ITERATIONS - 6), 2))
    generators = None
    for at in kills:
        deadline = time.monotonic() + 300
        while _trained(out) < at or not _pids(f"{out}/trainer.json"):
            assert run.poll() is None, run.stderr.read()[-3000:]
            assert time.monotonic() < deadline, f"iteration {at} not reached within 300 s (kills at {kills})"
            time.sleep(0.05)
        generators = generators or _pids(f"{out}/endpoints/generator-")
        subprocess.run(["pkill", "-KILL", "-f", f"{out}/trainer.json"], check=True)
        time.sleep(1.0)  # the killed trainer's iteration count stays until a new one resumes
    assert run.wait(600) == 0, f"kills at {kills}: " + run.stderr.read()[-3000:]
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == TrainerPhase.SUCCEEDED and summary.incarnation == 2, kills
    assert LocalRun.read(out / "run.json").trainer_restarts == 2
    records = IterationRecord.read_lines(out / "metrics.jsonl")
    assert [r.iteration for r in records] == list(range(ITERATIONS)), kills
    assert all(r.num_samples == PROMPTS * GROUP for r in records)
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    assert [e["iteration"] for e in ledger] == list(range(ITERATIONS))
    trained = [pid for e in ledger for pid in e["prompt_ids"]]
    assert len(trained) == len(set(trained)) == ITERATIONS * PROMPTS, kills
    assert {tuple(pid.split("-")[:1]) for pid in trained} == {(str(i),) for i in range(ITERATIONS)}
    # The same two generator processes served every trainer: reconnected, never restarted.
    assert LocalRun.read(out / "run.json").generator_replicas_started == 2
    assert generators is not None and len(generators) == 2
