"""`streamrl run` on a directory whose run completed: the same job says so within seconds and
starts nothing (the directory stays byte for byte as it was); a job asking for fewer iterations
is complete too; more iterations continue from the last checkpoint and train only the extra
ones; --fresh starts over beside it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from streamrl.records import IterationRecord, RunSummary, TrainerPhase
from tests.conftest import EXAMPLE, _merge, child_env

pytestmark = pytest.mark.slow

TRAINED = 2
SMALL = {"spec": {"algorithm": {"promptsPerStep": 4, "groupSize": 4, "maxNewTokens": 32}}}


def _job(directory: Path, iterations: int) -> Path:
    path = directory / f"job-{iterations}.yaml"
    job = _merge(yaml.safe_load(EXAMPLE.read_text()), _merge(SMALL, {"spec": {"algorithm": {
        "numIterations": iterations}}}))
    path.write_text(yaml.safe_dump(job))
    return path


def _run(job: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet",
                           *flags], env=child_env(), capture_output=True, text=True, timeout=600)


def _snapshot(out: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every path under the run directory with its size, mtime and (for files) its bytes."""
    return {str(p.relative_to(out)): (p.stat().st_size, p.stat().st_mtime_ns,
                                      p.read_bytes() if p.is_file() else b"")
            for p in sorted(out.rglob("*"))}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A run of TRAINED iterations, completed (never changed by the tests: they copy it)."""
    directory = tmp_path_factory.mktemp("finished")
    out = directory / "run"
    proc = _run(_job(directory, TRAINED), out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert RunSummary.read(out / "summary.json").phase == TrainerPhase.SUCCEEDED
    return out


def test_the_same_job_on_a_completed_run_says_so_in_seconds_and_starts_nothing(finished, tmp_path):
    before = _snapshot(finished)
    started = time.monotonic()
    proc = _run(_job(tmp_path, TRAINED), finished)
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert seconds < 5, f"{seconds:.1f} s"
    lines = proc.stderr.splitlines()
    assert lines[0] == f"complete: {finished} trained all {TRAINED} iterations the job asks for; nothing to start"
    assert lines[1].startswith(f"  summary: {finished / 'summary.json'} (")
    assert f"  model:   {finished / 'model'}" in lines
    assert f"  report:  {finished / 'report' / 'report.md'}" in lines
    assert _snapshot(finished) == before  # no process started: no log, record or job file touched

    fewer = _run(_job(tmp_path, TRAINED - 1), finished)
    assert fewer.returncode == 0, fewer.stderr[-3000:]
    assert fewer.stderr.startswith(f"complete: {finished} trained {TRAINED} iterations, more than the "
                                   f"{TRAINED - 1} the job asks for")
    assert _snapshot(finished) == before


def test_more_iterations_continue_the_completed_run_with_only_the_extra_ones(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    more = TRAINED + 1
    proc = _run(_job(tmp_path, more), out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[0].startswith(
        f"continuing {out}: it trained {TRAINED} iterations, the job now asks for {more}")
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == TrainerPhase.SUCCEEDED and summary.num_iterations == more
    assert (summary.resumed_from, summary.incarnation) == (TRAINED, 1)
    assert [r.iteration for r in IterationRecord.read_lines(out / "metrics.jsonl")] == list(range(more))
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    assert [(e["iteration"], e["incarnation"]) for e in ledger] == [(i, 0) for i in range(TRAINED)] + [(TRAINED, 1)]


def test_fresh_starts_over_beside_a_completed_run(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    before = _snapshot(out)
    proc = _run(_job(tmp_path, TRAINED), out, "--fresh")
    assert proc.returncode == 0, proc.stderr[-3000:]
    beside = tmp_path / "run-2"
    assert proc.stderr.startswith(f"--fresh: {out} holds a run; starting over in {beside}")
    summary = RunSummary.read(beside / "summary.json")
    assert summary.phase == TrainerPhase.SUCCEEDED and summary.num_iterations == TRAINED
    assert (summary.resumed_from, summary.incarnation) == (None, 0)
    assert _snapshot(out) == before
