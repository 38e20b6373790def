"""A bench run twice measures twice: the second invocation trains in run directories of its own
instead of resuming the first's finished runs and reprinting their figures (bench/modes.py,
its cheapest size: colocated only, 2 iterations of 4 prompts; bench/engines.py, the torch
engine alone at its smallest)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.provenance import Provenance
from streamrl.records import METRICS_FILE, SUMMARY_FILE, IterationRecord, RunSummary, TrainerPhase
from streamrl.trainer.checkpoint import RUN_FILE, RunStart
from tests.conftest import child_env

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--modes", "colocated", "--iterations", "2", "--prompts-per-step", "4"]


def run_modes_bench(out: Path) -> tuple[dict, Provenance]:
    """bench/modes.py at its smallest into `out`: its last JSON line and the provenance in it."""
    proc = subprocess.run([sys.executable, "bench/modes.py", *SMALL, "--out", str(out)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    return json.loads(line), Provenance.of_report(line)


@pytest.mark.slow
def test_a_bench_run_twice_with_the_same_out_trains_anew_in_new_run_directories(tmp_path):
    first, first_provenance = run_modes_bench(tmp_path)
    second, second_provenance = run_modes_bench(tmp_path)

    assert len(first_provenance.run_dirs) == len(second_provenance.run_dirs) == 1
    dirs = [Path(first_provenance.run_dirs[0]), Path(second_provenance.run_dirs[0])]
    assert dirs[0] != dirs[1]
    # Each in a directory of its invocation's own under --out, named for its mode.
    assert all(d.is_absolute() and d.name == "colocated" and d.parent.parent == tmp_path.resolve() for d in dirs)
    assert dirs[0].parent != dirs[1].parent

    # Both hold a whole run, each started once under an id of its own: nothing was resumed.
    starts = [RunStart.model_validate_json((d / RUN_FILE).read_text()) for d in dirs]
    assert [s.starts for s in starts] == [1, 1]
    assert starts[0].run_id != starts[1].run_id
    summaries = [RunSummary.read(d / SUMMARY_FILE) for d in dirs]
    for s in summaries:
        assert (s.phase, s.num_iterations, s.incarnation, s.resumed_from) == (TrainerPhase.SUCCEEDED, 2, 0, None)

    # The second trained after the first had finished, and printed its own figures.
    first_records, second_records = (IterationRecord.read_lines(d / METRICS_FILE) for d in dirs)
    assert [r.iteration for r in second_records] == [0, 1]
    assert min(r.time_unix for r in second_records) > max(r.time_unix for r in first_records)
    for report, summary in zip((first, second), summaries):
        assert report["samples_per_s"] == {"colocated": round(summary.samples_per_s, 2)}
    assert first_provenance.started_at < second_provenance.started_at


ENGINES_SMALL = ["--sections", "curve", "modes", "--engines", "torch", "--models", "builtin", "--batches", "1", "2",
                 "--new-tokens", "4", "--modes", "colocated", "--mode-iterations", "2", "--prompts-per-step", "4"]


@pytest.mark.slow
def test_the_engines_bench_builds_its_model_and_runs_anew_in_each_invocation(tmp_path):
    """bench/engines.py, torch alone at its smallest: each invocation builds its model and trains in
    a directory of its own, and reports the figures of its own run."""
    reports = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "bench/engines.py", *ENGINES_SMALL, "--out", str(tmp_path)], cwd=ROOT,
                              env=child_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = proc.stdout.strip().splitlines()[-1]
        reports.append((json.loads(line), Provenance.of_report(line)))
    dirs = [Path(p.run_dirs[0]) for _, p in reports]
    assert dirs[0].parent != dirs[1].parent and all(d.name == "torch-colocated" for d in dirs)
    for (report, _), d in zip(reports, dirs):
        assert (d.parent / "models" / "builtin" / "config.json").is_file()  # built in this invocation
        assert report["models"]["builtin"]["parameters"] == 503424
        assert set(report["tokens_per_s"]["builtin"]["torch"]) == {"1", "2"}
        summary = RunSummary.read(d / SUMMARY_FILE)
        assert report["samples_per_s"]["torch"]["colocated"] == round(summary.samples_per_s, 1)
        assert report["service"] == {} and report["vllm_over_torch_tokens_per_s"] == {}
