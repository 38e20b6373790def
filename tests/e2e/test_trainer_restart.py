"""`streamrl run` restarts a trainer that died, as its Job would: SIGKILLed mid-run (stream-
async, two generators), it is started again with the same command line and ports and resumes
from its checkpoint, the same generator processes reconnect to it (none is restarted), the run
finishes and says so, run.json counts the restart and events.jsonl records the death and the
restart; nothing is left behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.records import EVENTS_FILE, IterationRecord, LocalRun, RunEvent, RunSummary, TrainerPhase
from tests.conftest import child_env

pytestmark = pytest.mark.slow

ITERATIONS = 6


def _left_behind(out: Path) -> str:
    """Processes whose command line names the run directory (every child's does)."""
    return subprocess.run(["pgrep", "-a", "-f", str(out)], capture_output=True, text=True).stdout


def test_a_killed_trainer_is_restarted_and_its_generators_reconnect(write_job, tiny_model_dir, tmp_path):
    job = write_job({"spec": {
        "model": {"source": "path", "path": str(tiny_model_dir)},
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": 8, "groupSize": 4, "maxNewTokens": 32,
                      "microBatchSize": 16},
        "pipeline": {"mode": "stream-async"},
        "checkpoint": {"everyIterations": 2},
        "generators": {"pools": [{"name": "default", "replicas": 2, "engine": {"type": "torch", "maxBatchSize": 8}}],
                       "reconnect": {"initialBackoffSeconds": 0.2, "maxBackoffSeconds": 1.0}},
        # the restarted trainer waits for both: without, it can finish the last iterations with the
        # first to reconnect while the other is still backing off, and the run ends before it dials
        "trainer": {"minGenerators": 2},
    }})
    out = tmp_path / "run"
    run = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"],
                           env=child_env(), stderr=subprocess.PIPE, text=True)
    try:
        metrics, events_file = out / "metrics.jsonl", out / EVENTS_FILE
        deadline = time.monotonic() + 240

        def checkpointed() -> bool:  # written while later iterations run: its own event says it is complete
            return events_file.exists() and any(e.kind == "checkpoint" for e in RunEvent.read_lines(events_file))

        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3 and checkpointed()):
            assert run.poll() is None, run.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the run never reached its third iteration and a checkpoint"
            time.sleep(0.1)
        generators = {name: json.loads((out / "endpoints" / f"{name}.json").read_text())["pid"]
                      for name in ("generator-default-0", "generator-default-1")}
        subprocess.run(["pkill", "-KILL", "-f", f"{out}/trainer.json"], check=True)
        stderr = run.communicate(timeout=400)[1]
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, stderr[-3000:]
    assert "trainer exited with -9; restarting it (restart 1 of 3); its generators reconnect" in stderr
    record = LocalRun.read(out / "run.json")
    assert record.trainer_restarts == 1 and record.trainer_exit_code == 0 and record.failure is None
    assert record.generator_replicas_started == 2  # none replaced: both reconnected
    events = [(e.kind, e.process) for e in RunEvent.read_lines(out / EVENTS_FILE)]
    assert ("died", "trainer") in events and ("restarted", "trainer") in events
    assert events.index(("died", "trainer")) < events.index(("restarted", "trainer"))
    assert not [e for e in events if e[1].startswith("generator")]
    for name, pid in generators.items():
        assert json.loads((out / "endpoints" / f"{name}.json").read_text())["pid"] == pid, name
        log = (out / "logs" / f"{name}.log").read_text()
        assert log.count("reconnected to trainer") == 1, name
        assert "broke (UNAVAILABLE" in log, name
        assert "a new start of the trainer, incarnation 1" in log, name
    trainer_log = (out / "logs" / "trainer.log").read_text()
    assert "---- streamrl run: start 2 of trainer ----" in trainer_log  # one log, both starts
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == TrainerPhase.SUCCEEDED
    # The second start resumed from a checkpoint: every iteration is recorded once.
    assert ("resumed", "trainer") in events
    assert [r.iteration for r in IterationRecord.read_lines(out / "metrics.jsonl")] == list(range(ITERATIONS))
    assert time.sleep(0.5) or _left_behind(out) == ""
