"""`streamrl run` as docs/local.md has a newcomer type it: a relative `--out`, run from another
working directory. Its Prometheus scrapes every process, the Internal autoscaler gets its
inputs and decides, a Prometheus that cannot see its targets fails the run saying so, and
Ctrl-C stops every process and keeps the run's records."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.local.monitor import SCRAPE_TIMEOUT_ENV
from streamrl.local.prometheus import MISSING, LocalPrometheus
from streamrl.records import IterationRecord, LocalRun, RunSummary, ScalingRecord, TrainerPhase
from tests.blind_prometheus import blind_prometheus_dir
from tests.conftest import child_env

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not shutil.which("prometheus"), reason=MISSING)]
OUT = "runs/tiny"
"""The documented example (docs/local.md): relative to the working directory the run starts in."""


def _run(cwd: Path, job: Path, *flags: str, env: dict | None = None, timeout_s: float = 600):
    return subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", OUT, *flags], cwd=cwd,
                          env=env or child_env(), capture_output=True, text=True, timeout=timeout_s)


def _left_behind(out: Path) -> str:
    """Processes whose command line names the run directory (every child's does, Prometheus's too)."""
    return subprocess.run(["pgrep", "-a", "-f", str(out)], capture_output=True, text=True).stdout


def test_every_process_of_a_run_with_a_relative_out_is_scraped(write_job, tmp_path):
    # 60 iterations (about 9 s here): Prometheus sees every process 2-3 s after they start, later
    # on a busy machine, and 12 iterations (1.5 s) could end before it did (a CI run did).
    job = write_job({"metadata": {"name": "relative"}, "spec": {
        "algorithm": {"numIterations": 60, "promptsPerStep": 8, "groupSize": 8},
        "generators": {"pools": [{"name": "default", "replicas": 2, "engine": {"type": "torch", "maxBatchSize": 16}}],
                       "dispatch": {"policy": "skewness-aware"}},  # a ranker process too
    }})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = _run(cwd, job, "--prometheus")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = cwd / OUT
    assert "prometheus: scraping all 4 processes" in proc.stderr
    assert "Error adding file watch" not in (out / "prometheus" / "prometheus.log").read_text()

    # The run's Prometheus stopped with the run; its data, reopened, is what it scraped.
    shutil.copytree(out / "prometheus" / "data", tmp_path / "prom" / "data")
    prom = LocalPrometheus(tmp_path / "prom", rules=None)
    prom.start()
    try:
        end = IterationRecord.read_lines(out / "metrics.jsonl")[-1].time_unix
        up = {(r["metric"]["role"], r["metric"].get("replica", "")): float(r["value"][1])
              for r in prom.query('max by (role, replica) (max_over_time(up{rljob="relative"}[10m]))', at=end)}
    finally:
        prom.stop()
    assert up == {("trainer", ""): 1.0, ("ranker", ""): 1.0, ("generator", "default-0"): 1.0,
                  ("generator", "default-1"): 1.0}


def test_internal_autoscaling_with_a_relative_out_decides(write_job, tmp_path):
    job = write_job({"metadata": {"name": "elastic-relative"}, "spec": {
        "algorithm": {"numIterations": 100, "promptsPerStep": 8, "groupSize": 8},
        "generators": {"pools": [{"name": "default", "replicas": 1, "minReplicas": 1, "maxReplicas": 2,
                                  "engine": {"type": "torch", "maxBatchSize": 16}}]},
        "autoscaling": {"mode": "Internal", "intervalSeconds": 1},
    }})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = _run(cwd, job, "--quiet")  # no --prometheus: the autoscaler starts the one it reads
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = cwd / OUT
    rounds = ScalingRecord.read_lines(out / "autoscaling.jsonl")
    decided = [r for r in rounds if r.generation_s is not None]  # a decision round carries the inputs it saw
    assert decided, "the autoscaler only waited:\n" + "\n".join(sorted({r.reason for r in rounds}))
    assert all(r.train_s > 0 and r.window_s >= 2 for r in decided)
    local = LocalRun.read(out / "run.json")
    assert local.autoscaling is not None and local.autoscaling.last is not None and local.failure is None
    assert RunSummary.read(out / "summary.json").phase == TrainerPhase.SUCCEEDED


def test_a_prometheus_that_cannot_see_its_targets_fails_the_run_naming_them(write_job, tmp_path):
    bin_dir = blind_prometheus_dir(tmp_path)  # runs and answers, and discovers nothing
    job = write_job({"spec": {"algorithm": {"numIterations": 10_000}}})  # it would run long past the bound
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    bound_s = 15  # the default minute, shortened the way a user would
    env = {**child_env(), "PATH": f"{bin_dir}:{child_env()['PATH']}", SCRAPE_TIMEOUT_ENV: str(bound_s)}
    started = time.monotonic()
    proc = _run(cwd, job, "--quiet", "--prometheus", env=env, timeout_s=bound_s + 400)
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr[-3000:]
    out = cwd / OUT
    failure = LocalRun.read(out / "run.json").failure
    assert failure is not None and f"run failed: {failure}" in proc.stderr
    assert f"has not scraped every process within {bound_s} s" in failure
    assert "trainer (127.0.0.1:" in failure and "generator-default-0 (127.0.0.1:" in failure
    assert failure.count("not among its targets; answering on its admin port for") == 2
    assert 'msg="Error adding file watch"' in failure  # Prometheus's own words
    assert took < bound_s + 300
    assert _left_behind(out) == ""
    assert RunSummary.read(out / "summary.json").phase == TrainerPhase.INTERRUPTED  # stopped, and said so


def test_ctrl_c_stops_every_process_and_keeps_the_records_and_report(write_job, tmp_path):
    job = write_job({"spec": {"algorithm": {"numIterations": 10_000, "promptsPerStep": 8, "groupSize": 8}}})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = cwd / OUT
    # Started with SIGINT ignored, as a shell script's background job (`streamrl run job.yaml &`)
    # starts: Ctrl-C, or kill -INT, must stop it all the same.
    run = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", OUT, "--prometheus"],
                           cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert run.poll() is None and time.monotonic() < deadline, "the run did not reach iteration 3"
            time.sleep(0.2)
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, stderr[-3000:]
    assert "interrupted: stopping services" in stderr
    assert _left_behind(out) == ""  # trainer, generator and Prometheus
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == TrainerPhase.INTERRUPTED and summary.num_iterations >= 3
    local = LocalRun.read(out / "run.json")
    assert local.trainer_exit_code == 130 and local.generator_replicas_started == 1
    assert local.generator_replica_seconds > 0
    assert f"| iterations | {summary.num_iterations} |" in (out / "report" / "report.md").read_text()
