"""A generator asked to leave (SIGTERM: a scale-down, a pod deletion) drains: the trainer
assigns it nothing more, it finishes every sample it holds and exits 0, and nothing is
lost, re-dispatched or counted twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from streamrl.records import LocalRun, RunSummary
from tests.conftest import child_env

ITERATIONS, PROMPTS, GROUP = 14, 32, 8


def _start_and_kill_at(job, out, iteration: int, replica: str, sig: int, quiet: bool = True):
    """Run the job; once `iteration` iterations are recorded, send `sig` to that generator
    replica; return (returncode, stdout, stderr) of the finished run."""
    argv = [sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), *(["--quiet"] if quiet else [])]
    run = subprocess.Popen(argv, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= iteration):
            assert run.poll() is None and time.monotonic() < deadline, f"the run did not reach iteration {iteration}"
            time.sleep(0.2)
        os.kill(json.loads((out / "endpoints" / f"generator-{replica}.json").read_text())["pid"], sig)
        stdout, stderr = run.communicate(timeout=300)  # a run left waiting for a replica fails here
    finally:
        if run.poll() is None:
            run.kill()
    return run.returncode, stdout, stderr


@pytest.mark.slow
def test_sigterm_drains_a_generator_without_losing_or_repeating_work(write_job, tmp_path):
    job = write_job({"spec": {
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": PROMPTS, "groupSize": GROUP},
        "pipeline": {"mode": "stream-sync"},
        "trainer": {"minGenerators": 2},
        "generators": {"pools": [{"name": "default", "replicas": 2, "engine": {"type": "torch", "maxBatchSize": 16}}]},
    }})
    out = tmp_path / "run"
    code, _, stderr = _start_and_kill_at(job, out, 3, "default-1", signal.SIGTERM)
    assert code == 0, stderr[-3000:]
    summary = RunSummary.read(out / "summary.json")
    assert summary.num_iterations == ITERATIONS
    assert summary.num_samples == ITERATIONS * PROMPTS * GROUP
    assert summary.num_samples_accepted == ITERATIONS * PROMPTS * GROUP  # each sample once
    assert summary.num_samples_redispatched == 0  # the drained replica finished what it held
    assert summary.num_samples_duplicate_dropped == 0
    log = (out / "logs" / "generator-default-1.log").read_text()
    assert "draining (SIGTERM)" in log and "drained: the trainer has every sample this replica held" in log
    trainer_log = (out / "logs" / "trainer.log").read_text()
    assert "generator default-1 is draining (SIGTERM)" in trainer_log
    assert "warning" not in stderr.lower()  # the runner saw a clean exit (0), not a crash


@pytest.mark.slow
def test_a_crashed_generator_is_replaced_and_its_work_redone_once(write_job, tmp_path):
    iterations, prompts = 6, 16
    job = write_job({"spec": {
        "algorithm": {"numIterations": iterations, "promptsPerStep": prompts, "groupSize": GROUP},
        "pipeline": {"mode": "stream-sync"},
        "generators": {"pools": [{"name": "default", "replicas": 1, "engine": {"type": "torch", "maxBatchSize": 16}}]},
    }})
    out = tmp_path / "run"
    code, stdout, stderr = _start_and_kill_at(job, out, 2, "default-0", signal.SIGKILL, quiet=False)
    assert code == 0, stderr[-3000:]
    assert "generator-default-0 exited with -9; started generator-default-1 in its place" in stdout + stderr
    summary = RunSummary.read(out / "summary.json")
    assert summary.num_iterations == iterations
    assert summary.num_samples_accepted == iterations * prompts * GROUP  # each sample once
    assert summary.num_samples_duplicate_dropped == 0
    assert LocalRun.read(out / "run.json").generator_replicas_started == 2  # the runner's record
    assert "generator default-1 joined" in (out / "logs" / "trainer.log").read_text()
