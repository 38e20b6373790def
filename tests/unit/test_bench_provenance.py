"""bench/provenance.py: the commit and machine a bench's figures name, and a new directory per invocation."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bench.provenance import ROOT, Invocation, Machine, Provenance, git_commit, git_dirty


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_the_commit_is_the_checkouts_head():
    before = git(ROOT, "rev-parse", "HEAD")
    commit = git_commit()
    after = git(ROOT, "rev-parse", "HEAD")  # others may commit meanwhile
    assert commit in {before, after} and len(commit) == 40


def test_dirty_says_whether_the_tree_differs_from_its_commit(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "commit", "-q", "-m", "a")
    assert git_commit(tmp_path) == git(tmp_path, "rev-parse", "HEAD")
    assert git_dirty(tmp_path) is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_dirty(tmp_path) is True
    git(tmp_path, "checkout", "-q", "a.py")
    (tmp_path / "b.py").write_text("")  # untracked code counts too
    assert git_dirty(tmp_path) is True


def test_outside_a_checkout_there_is_no_commit_and_nothing_dirty(tmp_path):
    assert (git_commit(tmp_path), git_dirty(tmp_path)) == (None, False)


def test_the_machine_names_its_cores_and_cpu():
    machine = Machine.this()
    assert machine.cores == os.cpu_count()
    assert machine.cores_available == len(os.sched_getaffinity(0))
    assert 1 <= machine.cores_available <= machine.cores
    names = [line.partition(":")[2].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.partition(":")[0].strip() == "model name"]
    if not names:
        pytest.skip("no model name in /proc/cpuinfo here")
    assert machine.cpu_model == names[0]


def test_each_invocation_writes_into_a_new_directory_and_reports_what_it_measured(tmp_path):
    first, second = Invocation(tmp_path), Invocation(tmp_path)
    assert first.dir != second.dir and first.dir.is_dir() and second.dir.is_dir()
    assert first.dir.parent == second.dir.parent == tmp_path.resolve()
    run = first.run_dir("colocated")
    with pytest.raises(AssertionError):
        first.run_dir("colocated")
    line = first.report({"samples_per_s": 1.5})
    data = json.loads(line)
    assert data["samples_per_s"] == 1.5 and list(data)[-1] == "provenance"
    provenance = Provenance.of_report(line)
    assert provenance.run_dirs == (str(run),) and Path(provenance.run_dirs[0]).is_absolute()
    assert provenance.run_dir("colocated") == run
    started = datetime.fromisoformat(provenance.started_at)
    assert started.utcoffset() == timedelta(0)
    assert set(data["provenance"]) == {"git_commit", "git_dirty", "machine", "started_at", "run_dirs"}
    assert set(data["provenance"]["machine"]) == {"cores", "cores_available", "cpu_model"}
    assert Provenance.from_json(provenance.to_json()) == provenance


def test_a_bench_that_ran_another_counts_its_run_directories(tmp_path):
    inner, outer = Invocation(tmp_path / "inner"), Invocation(tmp_path)
    inner.run_dir("batch")
    outer.measured(Provenance.of_report(inner.report({})))
    own = outer.run_dir("profile")
    assert outer.provenance().run_dirs == (str(inner.dir / "batch"), str(own))
