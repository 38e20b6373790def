"""The run report from a hand-made run directory: files, numbers in the summary, errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from streamrl.report import load_run, plot_timeline, write_report


def _run_dir(tmp_path, n=6):
    d = tmp_path / "run"
    (d / "timeline").mkdir(parents=True)
    t = 1000.0
    records = []
    for i in range(n):
        t += 2.0
        records.append({"iteration": i, "reward_mean": 0.1 * i, "samples_per_s": 100.0 + i, "num_samples": 64,
                        "pipeline_bubble_ratio": 0.25, "skewness_bubble_ratio": 0.5 if i % 2 else 0.0,
                        "wall_s": 2.0, "generation_s": 1.5, "train_s": 0.5, "staleness_max": 0, "time_unix": t})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "summary.json").write_text(json.dumps({"phase": "Succeeded", "mode": "batch", "samples_per_s": 101.0}))
    (d / "job.yaml").write_text("metadata:\n  name: handmade\n")
    spans = [{"state": "busy", "reason": "", "start": 1000.0 + k, "end": 1000.5 + k} for k in range(n * 2)]
    spans += [{"state": "idle", "reason": "waiting_samples", "start": 1000.5 + k, "end": 1001.0 + k}
              for k in range(n * 2)]
    (d / "timeline" / "trainer.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans) + '{"state": "bu')
    gen = [{"state": "busy", "reason": "low_occupancy", "start": 1000.0, "end": 1003.0}]
    (d / "timeline" / "generator-a-0.jsonl").write_text(json.dumps(gen[0]) + "\n")
    return d


def test_report_files_and_summary(tmp_path):
    d = _run_dir(tmp_path)
    written = write_report(d)
    assert [p.name for p in written] == ["progress.png", "bubbles.png", "timeline.png", "report.md"]
    assert all(p.stat().st_size > 5000 for p in written[:3])
    md = (d / "report" / "report.md").read_text()
    assert "# Run report: handmade" in md
    assert "| pipeline-bubble ratio (wall-weighted) | 0.250 |" in md
    assert "| skewness-bubble ratio (wall-weighted) | 0.250 |" in md  # half the iterations at 0.5
    assert "| generation vs training s/iteration | 1.500 vs 0.500 (generation-bound) |" in md
    assert "| reward, first → last iteration | 0.000 → 0.500 |" in md


def test_the_autoscalers_changes_are_listed(tmp_path):
    d = _run_dir(tmp_path)
    rounds = [{"time_unix": 1003.5, "step": 0, "replicas": {"a": 1}, "reason": "measuring since the last change"},
              {"time_unix": 1004.25, "step": 1, "pool": "a", "replicas": {"a": 2}, "reason": "generation-bound: x"},
              {"time_unix": 1009.0, "step": -1, "pool": "a", "replicas": {"a": 1}, "reason": "generators idle"}]
    (d / "autoscaling.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    summary = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps({**summary, "generator_replica_seconds": 17.25,
                                                "generator_replicas_started": 2}))
    write_report(d)
    md = (d / "report" / "report.md").read_text()
    assert "| generator replica-seconds | 17.2 (2 replicas started) |" in md
    # Times count from the run's start: the first record's time_unix minus its elapsed_s (absent here: 1002 s).
    assert "| 2.2 | +1 a | a=2 | generation-bound: x |" in md and "| 7.0 | -1 a | a=1 | generators idle |" in md
    assert "measuring" not in md


def test_timeline_rows_and_bars(tmp_path):
    run = load_run(_run_dir(tmp_path))  # the torn last line of trainer.jsonl is skipped
    assert list(run.timelines) == ["trainer", "generator-a-0"]
    fig = plot_timeline(run)
    bars = {c.get_label(): c for c in fig.axes[0].collections}
    waiting = bars["trainer|('idle', 'waiting_samples')"]
    widths = [float(np.ptp(p.vertices[:, 0])) for p in waiting.get_paths()]
    assert len(widths) == 12 and np.allclose(widths, 0.5)
    assert "generator-a-0|('busy', 'low_occupancy')" in bars


def test_not_a_run_directory(tmp_path):
    with pytest.raises(ValueError, match="no metrics.jsonl here"):
        load_run(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "streamrl.cli", "report", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "no metrics.jsonl here" in proc.stderr
