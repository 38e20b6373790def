"""The record of a run a generator died in: `streamrl run` with 2 generators, one SIGKILLed
mid-run; the run finishes, and its report's timeline still has the killed replica's row,
ending near the kill, beside its replacement's (and, where the runner writes events.jsonl,
the death and the replacement marked on both rows and listed in report.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from streamrl.records import EVENTS_FILE, RunSummary
from streamrl.report import load_run, plot_timeline
from streamrl.timeline import HEARTBEAT_S
from tests.conftest import child_env

ITERATIONS, PROMPTS, GROUP, KILL_AFTER = 10, 16, 8, 3
SLACK_S = 1.5
"""How late a heartbeat may run on a loaded machine, beyond HEARTBEAT_S."""


@pytest.mark.slow
def test_a_sigkilled_generator_keeps_its_row_up_to_its_death(write_job, tmp_path):
    job = write_job({"spec": {
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": PROMPTS, "groupSize": GROUP},
        "pipeline": {"mode": "stream-async"},
        "generators": {"pools": [{"name": "default", "replicas": 2, "engine": {"type": "torch", "maxBatchSize": 16}}]},
    }})
    out = tmp_path / "run"
    run = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out)],
                           env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics, deadline = out / "metrics.jsonl", time.monotonic() + 300
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= KILL_AFTER):
            assert run.poll() is None and time.monotonic() < deadline, f"the run did not reach iteration {KILL_AFTER}"
            time.sleep(0.2)
        endpoint = out / "endpoints" / "generator-default-0.json"
        ready_at = endpoint.stat().st_mtime  # the replica served from here on
        os.kill(json.loads(endpoint.read_text())["pid"], signal.SIGKILL)
        killed_at = time.time()
        _, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stderr[-3000:]
    assert RunSummary.read(out / "summary.json").num_iterations == ITERATIONS

    run_dir = load_run(out)
    # The killed replica's row ends at its last heartbeat, within about a second of the kill.
    killed = run_dir.timelines["generator-default-0"]
    assert killed_at - HEARTBEAT_S - SLACK_S <= killed[-1]["end"] <= killed_at + 0.1
    # It had been running: the row starts with the process (before it was ready), not at its last heartbeat.
    assert killed[0]["start"] <= ready_at < killed[-1]["end"] - 0.5
    # Its replacement's row starts after the kill; the survivor's spans run to the end.
    replacement = run_dir.timelines["generator-default-2"]
    assert replacement[0]["start"] > killed_at - 0.1
    assert run_dir.timelines["generator-default-1"][-1]["end"] > killed_at + 1.0
    rows = [t.get_text() for t in plot_timeline(run_dir).axes[0].get_yticklabels()]
    assert rows == ["trainer", "generator-default-0", "generator-default-1", "generator-default-2"]
    md = (out / "report" / "report.md").read_text()

    # The runner's events (written by its supervisor once it records deaths): checked where present.
    deaths = [e for e in run_dir.events if e.kind == "died" and e.process == "generator-default-0"]
    if (out / EVENTS_FILE).exists() and deaths:
        assert killed_at - 0.1 <= deaths[0].time_unix <= killed_at + 5.0  # the supervisor polls
        marks = {line.get_gid(): line for line in plot_timeline(run_dir).axes[0].get_lines() if line.get_gid()}
        assert rows.index("generator-default-0") in list(marks["event:died"].get_ydata())
        assert "| died | generator-default-0 |" in md
