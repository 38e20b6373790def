"""bench/sim_fidelity.py's stage busy seconds: what a real run's timelines say each stage spent
busy (the trainer's file, every replica's together), and the means over a mode's repeats
against the simulation's."""

import json

import pytest

from bench.sim_fidelity import measured_busy_s, stage_busy


def _write(path, spans, torn=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"state": s, "reason": r, "start": a, "end": b}) for s, r, a, b in spans]
    path.write_text("\n".join(lines) + ("\n{\"state\": \"bu" if torn else "\n"))


def test_busy_seconds_sum_each_stage_from_its_timelines(tmp_path):
    timeline = tmp_path / "timeline"
    _write(timeline / "trainer.jsonl", [("idle", "no_work", 0.0, 1.0), ("busy", "", 1.0, 1.5),
                                        ("busy", "", 1.5, 2.25),  # a heartbeat's second piece
                                        ("idle", "waiting_samples", 2.25, 3.0), ("busy", "", 3.0, 3.5)])
    _write(timeline / "generator-default-0.jsonl", [("busy", "", 0.5, 1.0), ("busy", "low_occupancy", 1.0, 1.25)],
           torn=True)  # a killed replica's last line
    _write(timeline / "generator-default-1.jsonl", [("idle", "waiting_weights", 0.0, 2.0), ("busy", "", 2.0, 4.0)])
    busy = measured_busy_s(tmp_path)
    assert busy["trainer"] == pytest.approx(1.75)
    assert busy["generators"] == pytest.approx(0.75 + 2.0)


def test_stage_busy_means_repeats_and_divides_measured_by_predicted():
    rows = [{"predicted": {"busy_s": {"trainer": 10.0, "generators": 8.0}},
             "measured_busy_s": {"trainer": 12.0, "generators": 10.0}},
            {"predicted": {"busy_s": {"trainer": 14.0, "generators": 0.0}},
             "measured_busy_s": {"trainer": 12.0, "generators": 10.0}}]
    out = stage_busy(rows)
    assert out["trainer"] == {"predicted": 12.0, "measured": 12.0, "measured_over_predicted": 1.0}
    assert out["generators"] == {"predicted": 4.0, "measured": 10.0, "measured_over_predicted": 2.5}
    assert stage_busy([{**rows[1], "predicted": {"busy_s": {"trainer": 1.0, "generators": 0.0}}}])[
        "generators"]["measured_over_predicted"] is None
