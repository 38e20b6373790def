"""The run report from a hand-made run directory: files, numbers in the summary, errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from streamrl.records import (
    IterationRecord,
    LocalRun,
    RunEvent,
    RunSummary,
    ScalingSummary,
    TrainerPhase,
    write_json,
)
from streamrl.report import iteration_at, load_run, plot_progress, plot_timeline, write_report


def _record(i: int, t: float) -> IterationRecord:
    return IterationRecord(
        iteration=i, policy_version=i + 1, reward_mean=0.1 * i, num_samples=64, samples_per_s=100.0 + i,
        pipeline_bubble_ratio=0.25, skewness_bubble_ratio=0.5 if i % 2 else 0.0, wall_s=2.0, generation_s=1.5,
        train_s=0.5, completion_tokens_mean=4.0, completion_tokens_max=9, loss=0.1, clip_fraction=0.0, kl=0.0,
        grad_norm=1.0, num_micro_batches=2, staleness_mean=0.0, staleness_max=0, num_samples_stale_dropped=0,
        weight_sync_s_max=0.01, weight_bytes_from_trainer=100, weight_bytes_from_peers=0, elapsed_s=t - 1000.0,
        time_unix=t)


def _run_dir(tmp_path, n=6):
    d = tmp_path / "run"
    (d / "timeline").mkdir(parents=True)
    records = [_record(i, 1000.0 + 2.0 * (i + 1)) for i in range(n)]
    (d / "metrics.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    write_json(d / "summary.json", RunSummary.of(
        records, phase=TrainerPhase.SUCCEEDED, mode="batch", wall_s=13.0, num_prompts_dispatched=48,
        num_samples_accepted=64 * n, num_samples_duplicate_dropped=0, num_samples_redispatched=0,
        num_samples_rejected=0, num_samples_stale_dropped=3, weight_bytes_from_trainer=600,
        weight_bytes_from_peers=0))
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
    assert "| phase | Succeeded |" in md and "| samples/s | 32.0 |" in md and "| stale samples dropped | 3 |" in md
    assert "replica-seconds" not in md  # no run.json: the services were not started by `streamrl run`


def test_the_autoscalers_changes_are_listed(tmp_path):
    d = _run_dir(tmp_path)
    rounds = [{"time_unix": 1003.5, "step": 0, "replicas": {"a": 1}, "reason": "measuring since the last change"},
              {"time_unix": 1004.25, "step": 1, "pool": "a", "replicas": {"a": 2}, "reason": "generation-bound: x"},
              {"time_unix": 1009.0, "step": -1, "pool": "a", "replicas": {"a": 1}, "reason": "generators idle"}]
    (d / "autoscaling.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    write_json(d / "run.json", LocalRun(generator_replica_seconds=17.25, generator_replicas_started=2,
                                        trainer_exit_code=0, autoscaling=ScalingSummary(
                                            mode="Internal", scale_ups=1, scale_downs=1, replicas_final={"a": 1})))
    write_report(d)
    md = (d / "report" / "report.md").read_text()
    # summary.json (the trainer's) and run.json (the runner's) in one table.
    assert "| phase | Succeeded |" in md and "| generator replica-seconds | 17.2 (2 replicas started) |" in md
    assert "| autoscaling | 1 up, 1 down; final a=1 |" in md
    # Times count from the run's start: the first record's time_unix minus its elapsed_s (1002 - 2 s).
    assert "| 4.2 | +1 a | a=2 | generation-bound: x |" in md and "| 9.0 | -1 a | a=1 | generators idle |" in md
    assert "measuring" not in md


def test_a_run_the_runner_failed_says_why(tmp_path):
    d = _run_dir(tmp_path)
    write_json(d / "run.json", LocalRun(generator_replica_seconds=3.0, generator_replicas_started=1,
                                        trainer_exit_code=130, failure="Prometheus has not scraped\ntrainer | x"))
    write_report(d)
    assert "| run failed | Prometheus has not scraped trainer / x |" in (d / "report" / "report.md").read_text()


def test_a_renamed_field_fails_naming_the_file_and_the_field(tmp_path):
    d = _run_dir(tmp_path)
    summary = json.loads((d / "summary.json").read_text())
    summary["bubble_ratio"] = summary.pop("pipeline_bubble_ratio")
    (d / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"(?s)summary.json: not a RunSummary.*pipeline_bubble_ratio"):
        load_run(d)


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


def test_one_timeline_row_per_trainer_rank_in_rank_order(tmp_path):
    d = _run_dir(tmp_path)
    for rank in (10, 2):  # rank 1's file is missing (its node kept it): no row, no error
        spans = [{"state": "busy", "reason": "", "start": 1000.0 + k, "end": 1000.25 + k} for k in range(4)]
        spans += [{"state": "idle", "reason": "waiting_leader", "start": 1000.25 + k, "end": 1001.0 + k}
                  for k in range(4)]
        (d / "timeline" / f"trainer-rank-{rank}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))
    run = load_run(d)
    assert list(run.timelines) == ["trainer", "trainer-rank-2", "trainer-rank-10", "generator-a-0"]
    fig = plot_timeline(run)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(run.timelines)
    bars = {c.get_label(): c for c in fig.axes[0].collections}
    waiting = bars["trainer-rank-10|('idle', 'waiting_leader')"]
    assert tuple(waiting.get_facecolor()[0][:3]) != (0.0, 0.0, 0.0)  # a colour of its own, in the legend
    assert "trainer rank waiting for rank 0's next command" in [t.get_text() for t in fig.axes[0].get_legend().texts]
    write_report(d)
    md = (d / "report" / "report.md").read_text()
    assert "| 0 | 6.0 | 6.0 | waiting_samples 6.0 |" in md
    assert "| 2 | 1.0 | 3.0 | waiting_leader 3.0 |" in md and "| 10 | 1.0 | 3.0 | waiting_leader 3.0 |" in md
    assert md.index("| 2 | 1.0") < md.index("| 10 | 1.0")


def test_a_single_trainer_has_no_ranks_table(tmp_path):
    write_report(_run_dir(tmp_path))
    assert "## Trainer ranks" not in (tmp_path / "run" / "report" / "report.md").read_text()


def _events(d):
    """A generator killed and replaced, the trainer restarted and resumed, a checkpoint, a
    scale-up; generator-a-1 died before it wrote a span. The last line is torn."""
    events = [RunEvent(time_unix=1006.5, kind="died", process="generator-a-0", detail="exit -9 (SIGKILL)"),
              RunEvent(time_unix=1006.75, kind="replaced", process="generator-a-0", detail="by generator-a-2"),
              RunEvent(time_unix=1004.0, kind="checkpoint", process="trainer", detail="iteration 1"),
              RunEvent(time_unix=1008.0, kind="restarted", process="trainer", detail="exit -9 | 1 of 3"),
              RunEvent(time_unix=1009.0, kind="resumed", process="trainer", detail="from iteration 1"),
              RunEvent(time_unix=1010.0, kind="died", process="generator-a-1", detail="exit 1"),
              RunEvent(time_unix=1011.0, kind="scaled", process="generator-a-3", detail="+1 a: generation-bound")]
    (d / "events.jsonl").write_text("".join(e.to_json() + "\n" for e in events) + '{"time_unix": 1012.0, "ki')
    (d / "timeline" / "generator-a-2.jsonl").write_text(
        json.dumps({"state": "busy", "reason": "", "start": 1007.0, "end": 1012.0}) + "\n")
    return events


def test_events_are_marked_on_the_timeline_rows_of_their_processes(tmp_path):
    d = _run_dir(tmp_path)
    events = _events(d)
    run = load_run(d)  # the torn last line of events.jsonl is skipped
    assert [e.time_unix for e in run.events] == sorted(e.time_unix for e in events)
    fig = plot_timeline(run)
    ax = fig.axes[0]
    # The process that died before writing a span has a row of its own; rows in numeric order.
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows == ["trainer", "generator-a-0", "generator-a-1", "generator-a-2", "generator-a-3"]
    marks = {line.get_gid(): line for line in ax.get_lines() if (line.get_gid() or "").startswith("event:")}
    assert set(marks) == {f"event:{k}" for k in ("died", "replaced", "checkpoint", "restarted", "resumed", "scaled")}
    died = marks["event:died"]
    t0 = 1000.0  # the first span's start
    assert list(died.get_xdata()) == [6.5, 10.0]
    assert list(died.get_ydata()) == [rows.index("generator-a-0"), rows.index("generator-a-1")]
    assert died.get_marker() != marks["event:resumed"].get_marker()
    assert list(marks["event:resumed"].get_xdata()) == [1009.0 - t0]
    assert list(marks["event:resumed"].get_ydata()) == [0]
    legend = [t.get_text() for t in ax.get_legend().texts]
    assert {"died", "replaced by another replica", "resumed from a checkpoint", "checkpoint saved"} <= set(legend)
    assert "preempted (SIGTERM, checkpointed)" not in legend  # only kinds that happened


def test_events_are_vertical_lines_on_the_progress_plot_at_their_iteration(tmp_path):
    d = _run_dir(tmp_path)
    _events(d)
    run = load_run(d)
    fig = plot_progress(run)
    reward = fig.axes[0].get_lines()[0]
    assert list(reward.get_xdata()) == list(range(6))  # the reward line is still the first
    for ax in fig.axes:
        marks = [(line.get_gid(), line.get_xdata()[0]) for line in ax.get_lines()
                 if (line.get_gid() or "").startswith("event:")]
        # Iteration i ends at 1002 + 2 i: a moment during it lies between i - 1 and i.
        assert marks == [("event:checkpoint:trainer", 1.0), ("event:died:generator-a-0", 2.25),
                         ("event:replaced:generator-a-0", 2.375), ("event:restarted:trainer", 3.0),
                         ("event:resumed:trainer", 3.5), ("event:died:generator-a-1", 4.0),
                         ("event:scaled:generator-a-3", 4.5)]
    assert iteration_at(run, 900.0) == -1.0 and iteration_at(run, 2000.0) == 5.0  # clamped to the run
    assert "died" in [t.get_text() for t in fig.axes[0].get_legend().texts]


def test_report_md_lists_the_events_from_the_runs_start(tmp_path):
    d = _run_dir(tmp_path)
    _events(d)
    write_report(d)
    md = (d / "report" / "report.md").read_text()
    assert "| process events | died 2, restarted 1, replaced 1, resumed 1, checkpoint 1, scaled 1 |" in md
    table = md[md.index("## Events"):]
    rows = [line for line in table.splitlines()[4:] if line.startswith("|")]
    # The run started at 1000 (the first record's time less its elapsed seconds).
    assert rows == ["| 4.0 | checkpoint | trainer | iteration 1 |",
                    "| 6.5 | died | generator-a-0 | exit -9 (SIGKILL) |",
                    "| 6.8 | replaced | generator-a-0 | by generator-a-2 |",
                    "| 8.0 | restarted | trainer | exit -9 / 1 of 3 |",
                    "| 9.0 | resumed | trainer | from iteration 1 |",
                    "| 10.0 | died | generator-a-1 | exit 1 |",
                    "| 11.0 | scaled | generator-a-3 | +1 a: generation-bound |"]


def test_no_events_file_no_events_table(tmp_path):
    d = _run_dir(tmp_path)
    write_report(d)
    md = (d / "report" / "report.md").read_text()
    assert "## Events" not in md and "process events" not in md
    (d / "events.jsonl").write_text("")  # created, nothing happened yet
    assert load_run(d).events == []
