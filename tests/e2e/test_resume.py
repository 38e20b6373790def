"""A run stopped by SIGTERM resumes where it stopped: `streamrl run` is terminated mid-run,
its trainer finishes the step it is in, writes a checkpoint and exits 0 as Preempted; the
same command on the same directory says it resumes, continues at the following iteration
and finishes with every iteration in metrics.jsonl once and no prompt trained twice."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.records import EVENTS_FILE, IterationRecord, LocalRun, RunEvent, RunSummary, TrainerPhase
from tests.conftest import child_env

pytestmark = pytest.mark.slow

ITERATIONS, PROMPTS, GROUP = 24, 8, 4


def _ledger(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]


def test_sigterm_preempts_with_a_checkpoint_and_the_next_run_resumes_at_the_following_iteration(write_job,
                                                                                               tmp_path):
    job = write_job({"spec": {
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": PROMPTS, "groupSize": GROUP},
        "pipeline": {"mode": "stream-async"},
        "generators": {"pools": [{"name": "default", "replicas": 2}]},
        "checkpoint": {"everyIterations": 5, "keep": 2},
    }})
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"]
    first = subprocess.Popen(cmd, env=child_env(), stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 7):
        assert first.poll() is None, first.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no 7 iterations within 240 s"
        time.sleep(0.1)
    first.send_signal(signal.SIGTERM)
    assert first.wait(120) == 128 + signal.SIGTERM, first.stderr.read()[-3000:]
    stopped = RunSummary.read(out / "summary.json")
    assert stopped.phase == TrainerPhase.PREEMPTED and LocalRun.read(out / "run.json").trainer_exit_code == 0
    k = stopped.num_iterations
    assert 7 <= k < ITERATIONS and stopped.last_checkpoint.iteration == k  # the step it was in, then saved

    second = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming: {out} holds checkpoints up to iter-{k:05d}" in second.stderr
    done = RunSummary.read(out / "summary.json")
    assert done.phase == TrainerPhase.SUCCEEDED and (done.resumed_from, done.incarnation) == (k, 1)
    records = IterationRecord.read_lines(metrics)
    assert [r.iteration for r in records] == list(range(ITERATIONS))  # each once, in order
    assert done.num_iterations == ITERATIONS and done.num_samples_accepted == ITERATIONS * PROMPTS * GROUP
    ledger = _ledger(out)
    assert [e["iteration"] for e in ledger] == list(range(ITERATIONS))
    assert {e["incarnation"] for e in ledger if e["iteration"] >= k} == {1}
    trained = [pid for e in ledger for pid in e["prompt_ids"]]
    assert len(trained) == len(set(trained)) == ITERATIONS * PROMPTS  # no prompt twice, none missing
    resumed = [e for e in RunEvent.read_lines(out / EVENTS_FILE) if e.kind == "resumed"]
    assert len(resumed) == 1 and resumed[0].detail.startswith(f"iteration {k} ")
    assert "preempted" in {e.kind for e in RunEvent.read_lines(out / EVENTS_FILE)}
