"""Observability end to end: a real `streamrl run --prometheus` scraped by a real Prometheus.
Every dashboard query returns data, the recording rules' bubble ratios agree with the
run's own metrics.jsonl, and the run report draws what metrics.jsonl holds."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml
from matplotlib import image

from streamrl.local.prometheus import LocalPrometheus
from streamrl.records import IterationRecord
from streamrl.report import load_run, plot_bubbles, plot_progress, plot_timeline
from tests.conftest import EXAMPLE, _merge, child_env
from tests.unit.test_dashboards import dashboard_queries

ITERATIONS = 100
"""Long enough for the autoscaler to decide a few rounds in (a replica joins in under a second)."""
JOB = {
    "metadata": {"name": "observed"},
    "spec": {
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": 8, "groupSize": 8},
        "pipeline": {"mode": "stream-sync"},
        "generators": {"pools": [{"name": "default", "replicas": 2, "minReplicas": 2, "maxReplicas": 2}],
                       "dispatch": {"policy": "skewness-aware"}},
        # The autoscaler runs (so the Scaling panels have data) with nothing it may change.
        "autoscaling": {"mode": "Internal", "intervalSeconds": 2},
    },
}
RULES = {"streamrl:pipeline_bubble_ratio:rate1m": "pipeline_bubble_ratio",
         "streamrl:skewness_bubble_ratio:rate1m": "skewness_bubble_ratio"}


def windowed(records: list[IterationRecord], key: str, lo: float, hi: float) -> float:
    """What a 1m rate() of the bubble-seconds counter reads at `hi`: the bubble seconds of
    the iterations overlapping [lo, hi] (spread evenly over each iteration) / (hi - lo)."""
    total = 0.0
    for r in records:
        end, start = r.time_unix, r.time_unix - r.wall_s
        overlap = max(0.0, min(end, hi) - max(start, lo))
        total += getattr(r, key) * overlap
    return total / (hi - lo)


def edge_slack(records: list[IterationRecord], key: str, lo: float, hi: float, margin_s: float = 1.0) -> float:
    """How far `windowed` can honestly miss at its two edges: the whole bubble of every iteration
    within `margin_s` (a scrape and rule interval) of `lo` or `hi`, / (hi - lo). A bubble is not
    spread evenly over its iteration (a skewness bubble sits at the end of generation), so an
    iteration cut by the window edge may have all of it inside or none."""
    near = [r for r in records
            if any(r.time_unix - r.wall_s - margin_s <= edge <= r.time_unix + margin_s for edge in (lo, hi))]
    return sum(getattr(r, key) * r.wall_s for r in near) / (hi - lo)


@pytest.fixture(scope="module")
def observed_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("observed")
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump(_merge(yaml.safe_load(EXAMPLE.read_text()), JOB)))
    out = tmp / "run"
    proc = subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--prometheus"],
                          env=child_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prometheus: http://127.0.0.1:" in proc.stderr and f"done: {ITERATIONS} iterations" in proc.stderr
    return out


@pytest.mark.slow
def test_dashboards_and_rules_against_prometheus(observed_run, tmp_path):
    records = IterationRecord.read_lines(observed_run / "metrics.jsonl")
    assert len(records) == ITERATIONS
    # The run's Prometheus stopped with the run; its data, reopened, is what it scraped.
    shutil.copytree(observed_run / "prometheus" / "data", tmp_path / "data")
    prom = LocalPrometheus(tmp_path, rules=None)
    prom.start()
    try:
        end = records[-1].time_unix
        empty = [f"{name} / {title}: {expr}" for name, items in dashboard_queries().items()
                 for title, expr in items if not prom.query(expr, at=end - 1)]
        assert empty == [], "dashboard queries without data:\n" + "\n".join(empty)
        checked = 0
        for rule, key in RULES.items():
            for at in (end - 1, end - 5):
                [got] = prom.query(rule, at=at)
                [stamp] = prom.query(f"timestamp({rule})", at=at)
                t, value = float(stamp["value"][1]), float(got["value"][1])
                assert 0.0 <= value <= 1.0, f"{rule} = {value}"
                expected = windowed(records, key, t - 60, t)
                slack = edge_slack(records, key, t - 60, t)
                assert abs(value - expected) <= 0.1 * expected + 0.003 + slack, \
                    f"{rule} at {t:.1f}: Prometheus {value:.4f}, metrics.jsonl {expected:.4f} (edges {slack:.4f})"
                checked += 1
        assert checked == 4
    finally:
        prom.stop()


@pytest.mark.slow
def test_report_draws_what_metrics_jsonl_holds(observed_run):
    records = IterationRecord.read_lines(observed_run / "metrics.jsonl")
    report = observed_run / "report"
    for name in ("progress.png", "bubbles.png", "timeline.png"):
        pixels = image.imread(report / name)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 400 and float(np.std(pixels)) > 0.01, name
    md = (report / "report.md").read_text()
    assert "# Run report: observed" in md and f"| iterations | {ITERATIONS} |" in md
    assert "![timeline](timeline.png)" in md

    run = load_run(observed_run)
    progress, bubbles, timeline = plot_progress(run), plot_bubbles(run), plot_timeline(run)
    reward, throughput = progress.axes[0].lines[0], progress.axes[1].lines[0]
    assert list(reward.get_xdata()) == [r.iteration for r in records]
    assert np.allclose(reward.get_ydata(), [r.reward_mean for r in records])
    assert np.allclose(throughput.get_ydata(), [r.samples_per_s for r in records])
    pipeline, skewness = bubbles.axes[0].lines
    assert np.allclose(pipeline.get_ydata(), [r.pipeline_bubble_ratio for r in records])
    assert np.allclose(skewness.get_ydata(), [r.skewness_bubble_ratio for r in records])
    # The Gantt chart: one row per process, and the trainer's drawn busy time is its timeline's.
    assert [t.get_text() for t in timeline.axes[0].get_yticklabels()] == \
        ["trainer", "generator-default-0", "generator-default-1"]
    bars = {c.get_label(): c for c in timeline.axes[0].collections}
    drawn = sum(w for _, w in _bar_extents(bars["trainer|('busy', '')"]))
    spans = [s for s in run.timelines["trainer"] if s["state"] == "busy" and s["reason"] == ""]
    assert drawn == pytest.approx(sum(s["end"] - s["start"] for s in spans), rel=1e-6)
    # Training happened inside the iterations: most of the trainer's iteration time is drawn busy or waiting.
    assert drawn > 0.3 * sum(r.train_s for r in records)


def _bar_extents(collection) -> list[tuple[float, float]]:
    out = []
    for path in collection.get_paths():
        xs = path.vertices[:, 0]
        out.append((float(xs.min()), float(xs.max() - xs.min())))
    return out
