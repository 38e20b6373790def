"""`streamrl run` with a trainer of two ranks (trainer.processesPerNode 2, FSDP2 over gloo):
it learns in stream-sync and stream-async with every sample accepted once; Ctrl-C, a SIGTERM
(a `kill`, a supervisor) stop everything; a rank that dies restarts the whole group (its
generator reconnects), and with no restarts left ends the run within moments, the rank
named. Each rank serves its own forward/backward and collective seconds, and the report has
a row per rank."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamrl.records import EVENTS_FILE, IterationRecord, LocalRun, RunEvent, RunSummary, TrainerPhase
from streamrl.report import load_run, plot_timeline
from tests.conftest import child_env

pytestmark = pytest.mark.slow

ITERATIONS, PROMPTS, GROUP = 15, 16, 8


def _job(write_job, mode: str, iterations: int = ITERATIONS, spec: dict | None = None, **trainer) -> Path:
    return write_job({"spec": {
        "algorithm": {"numIterations": iterations, "promptsPerStep": PROMPTS, "groupSize": GROUP},
        "pipeline": {"mode": mode},
        "trainer": {"processesPerNode": 2, "processGroupTimeoutSeconds": 60, **trainer},
        **(spec or {}),
    }})


def _left_behind(out: Path) -> str:
    """Processes whose command line names the run directory (every child's does)."""
    return subprocess.run(["pgrep", "-a", "-f", str(out)], capture_output=True, text=True).stdout


@pytest.mark.parametrize("mode", ["stream-sync", "stream-async"])
def test_two_ranks_learn_and_accept_every_sample_once(write_job, tmp_path, mode):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(_job(write_job, mode)), "--out", str(out),
                           "--quiet"], env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == TrainerPhase.SUCCEEDED and summary.num_iterations == ITERATIONS
    assert summary.num_samples_accepted == ITERATIONS * PROMPTS * GROUP  # each sample once
    assert summary.num_samples_duplicate_dropped == summary.num_samples_redispatched == 0
    records = IterationRecord.read_lines(out / "metrics.jsonl")
    # The first iteration's reward is the untrained policy's; the last five's mean what it learnt.
    learnt = sum(r.reward_mean for r in records[-5:]) / 5
    assert learnt - records[0].reward_mean >= 0.05, [round(r.reward_mean, 3) for r in records]
    logs = (out / "logs" / "trainer-rank-1.log").read_text()
    assert "rank 1 of 2 (local rank 1) joined the gloo group" in logs
    # The report `streamrl run` wrote: a timeline row per rank, rank 1 busy and waiting for rank 0.
    run = load_run(out)
    assert list(run.timelines)[:2] == ["trainer", "trainer-rank-1"]
    assert [t.get_text() for t in plot_timeline(run).axes[0].get_yticklabels()][:2] == ["trainer", "trainer-rank-1"]
    follower = {(s["state"], s["reason"]) for s in run.timelines["trainer-rank-1"]}
    assert {("busy", ""), ("idle", "waiting_leader")} <= follower
    md = (out / "report" / "report.md").read_text()
    assert "## Trainer ranks" in md and "\n| 0 | " in md and "\n| 1 | " in md
    assert time.sleep(0.5) or _left_behind(out) == ""


@pytest.mark.parametrize("sig, code, phase", [(signal.SIGINT, 130, TrainerPhase.INTERRUPTED),
                                              (signal.SIGTERM, 143, TrainerPhase.PREEMPTED)], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_every_rank(write_job, tmp_path, sig, code, phase):
    out = tmp_path / "run"
    run = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(_job(write_job, "stream-sync", 1000)),
                            "--out", str(out), "--quiet"], env=child_env(), stderr=subprocess.PIPE, text=True)
    _wait_for_iterations(out, run, 2)
    # Every rank serves its own seconds, labelled with its rank, on its own /metrics.
    for rank, process in enumerate(["trainer", "trainer-rank-1"]):
        got = _rank_metrics(out / f"{process}.json", str(rank))
        assert got["streamrl_trainer_rank_info"] == 1, process
        assert got["streamrl_trainer_forward_backward_seconds_count"] >= 2, process  # a micro-batch an iteration
        assert got["streamrl_trainer_forward_backward_seconds_sum"] > 0, process
        for kind in ("forward_all_gather", "optimizer_step", "all_reduce", "gather_weights"):
            assert got[f"streamrl_trainer_collective_seconds_total|{kind}"] > 0, (process, kind)
    run.send_signal(sig)
    assert run.wait(90) == code, run.stderr.read()[-3000:]
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == phase
    # Stopped at a safe point with what both ranks trained checkpointed: a rerun resumes there.
    assert summary.last_checkpoint is not None and summary.last_checkpoint.iteration == summary.num_iterations
    assert sorted(p.name for p in Path(summary.last_checkpoint.path).iterdir()) == \
        [".metadata", "__0_0.distcp", "__1_0.distcp", "manifest.json", "rank-0.pt", "rank-1.pt", "trainer.json"]
    assert (out / "model" / "model.safetensors").is_file()  # gathered from both ranks, written
    assert time.sleep(0.5) or _left_behind(out) == ""


def test_a_rank_that_dies_with_no_restarts_left_ends_the_run_at_once_naming_it(write_job, tmp_path):
    out = tmp_path / "run"
    job = _job(write_job, "stream-sync", 1000, restartLimit=0)
    run = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"],
                           env=child_env(), stderr=subprocess.PIPE, text=True)
    _wait_for_iterations(out, run, 2)
    subprocess.run(["pkill", "-KILL", "-f", f"{out}/trainer-rank-1.json"], check=True)
    killed = time.monotonic()
    stderr = run.communicate(timeout=120)[1]
    took = time.monotonic() - killed
    assert run.returncode == 1
    assert "run failed: trainer rank 1 (trainer-rank-1) exited with -9" in stderr
    assert took < 30, took  # not the process group's 60 s timeout: the runner saw it go
    assert "trainer rank 1" in LocalRun.read(out / "run.json").failure
    assert time.sleep(0.5) or _left_behind(out) == ""


def test_a_rank_that_dies_restarts_the_whole_group_and_the_run_finishes(write_job, tmp_path):
    out, iterations = tmp_path / "run", 6
    job = _job(write_job, "stream-sync", iterations, {"checkpoint": {"everyIterations": 2}})
    run = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"],
                           env=child_env(), stderr=subprocess.PIPE, text=True)
    _wait_for_iterations(out, run, 3)
    subprocess.run(["pkill", "-KILL", "-f", f"{out}/trainer-rank-1.json"], check=True)
    stderr = run.communicate(timeout=400)[1]
    assert run.returncode == 0, stderr[-3000:]
    assert "trainer rank 1 (trainer-rank-1) exited with -9; restarting all 2 of its ranks (restart 1 of 3)" in stderr
    record = LocalRun.read(out / "run.json")
    assert record.trainer_restarts == 1 and record.generator_replicas_started == 1
    events = [(e.kind, e.process) for e in RunEvent.read_lines(out / EVENTS_FILE)]
    assert events.index(("died", "trainer-rank-1")) < events.index(("restarted", "trainer"))
    for process in ("trainer", "trainer-rank-1"):  # both ranks started again, each log telling both starts
        assert f"---- streamrl run: start 2 of {process} ----" in (out / "logs" / f"{process}.log").read_text()
    assert RunSummary.read(out / "summary.json").phase == TrainerPhase.SUCCEEDED
    assert [r.iteration for r in IterationRecord.read_lines(out / "metrics.jsonl")] == list(range(iterations))
    assert time.sleep(0.5) or _left_behind(out) == ""


def _rank_metrics(endpoint: Path, rank: str) -> dict[str, float]:
    """The per-rank series a rank serves on /metrics (its admin port from its endpoint file),
    labelled with `rank`; a collective's by name|kind."""
    text = httpx.get(f"http://127.0.0.1:{json.loads(endpoint.read_text())['admin_port']}/metrics", timeout=10).text
    return {f"{s.name}|{s.labels['kind']}" if "kind" in s.labels else s.name: s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("streamrl_trainer_") and s.labels.get("rank") == rank}


def _wait_for_iterations(out: Path, run: subprocess.Popen, n: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    metrics = out / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= n):
        assert run.poll() is None, run.stderr.read()[-3000:]
        assert time.monotonic() < deadline, f"no {n} iterations within {timeout_s:.0f} s"
        time.sleep(0.2)
