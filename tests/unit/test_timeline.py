"""The timeline writer: spans on disk as they close, the open one kept up to date by a
heartbeat, so a process killed with SIGKILL leaves its row up to within a heartbeat of its death."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from streamrl.metrics import NO_WORK, WAITING_SAMPLES, ServiceMetrics
from streamrl.timeline import Timeline, read_spans

HEARTBEAT_S = 0.2

_WRITER = """
import sys, time
from streamrl.timeline import Timeline
t = Timeline(sys.argv[1], heartbeat_s=float(sys.argv[2]))
for i in range(3):
    t.enter(("busy", ""))
    time.sleep(0.02)
    t.enter(("idle", "waiting_samples"))
    time.sleep(0.02)
t.enter(("busy", "long"))  # never closed: only its heartbeats reach the disk
print("in the long span", flush=True)
time.sleep(600)
"""


def test_a_sigkilled_writer_leaves_its_spans_up_to_its_last_heartbeat(tmp_path):
    path = tmp_path / "timeline" / "generator-default-0.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(HEARTBEAT_S)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "in the long span"
        time.sleep(1.5)
        killed_at = time.time()
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    spans = read_spans(path)
    # Every closed span, in order, then the open one as far as its last heartbeat.
    assert [(s["state"], s["reason"]) for s in spans] == \
        [("busy", ""), ("idle", "waiting_samples")] * 3 + [("busy", "long")]
    assert all(a["end"] == b["start"] for a, b in zip(spans, spans[1:], strict=False))
    long = spans[-1]
    assert long["end"] - long["start"] >= 1.0  # written while it was still open
    # Loaded machines run the heartbeat late; a second of slack still catches a missing one.
    assert killed_at - 1.0 - HEARTBEAT_S <= long["end"] <= killed_at
    # Heartbeat pieces were written as lines of their own and read back as one span.
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sum(s["reason"] == "long" for s in lines) >= 4


def test_heartbeat_pieces_are_joined_and_the_states_kept(tmp_path):
    path = tmp_path / "t.jsonl"
    t = Timeline(path, heartbeat_s=3600)  # the thread stays out of it: beats are explicit
    t.enter(("idle", NO_WORK), at=10.0)
    t.enter(("busy", ""), at=10.5)
    t.heartbeat(now=11.0)
    t.heartbeat(now=12.0)
    t.enter(("idle", WAITING_SAMPLES), at=12.5)
    t.close(at=13.0)
    t.enter(("busy", ""), at=14.0)  # after close: nothing
    assert len(path.read_text().splitlines()) == 5
    assert read_spans(path) == [
        {"state": "idle", "reason": NO_WORK, "start": 10.0, "end": 10.5},
        {"state": "busy", "reason": "", "start": 10.5, "end": 12.5},
        {"state": "idle", "reason": WAITING_SAMPLES, "start": 12.5, "end": 13.0},
    ]


def test_a_torn_last_line_is_skipped_and_the_next_writer_starts_a_new_line(tmp_path):
    path = tmp_path / "trainer.jsonl"
    path.write_text(json.dumps({"state": "busy", "reason": "", "start": 1.0, "end": 2.0}) + '\n{"state": "id')
    t = Timeline(path, heartbeat_s=3600)  # a restarted trainer appends to its own name's file
    t.enter(("idle", NO_WORK), at=5.0)
    t.close(at=6.0)
    assert read_spans(path) == [{"state": "busy", "reason": "", "start": 1.0, "end": 2.0},
                                {"state": "idle", "reason": NO_WORK, "start": 5.0, "end": 6.0}]


def test_a_stage_clocks_spans_are_on_disk_as_they_close(tmp_path):
    path = tmp_path / "timeline" / "trainer.jsonl"
    metrics = ServiceMetrics("trainer", path)
    metrics.clock.busy()
    metrics.clock.idle(WAITING_SAMPLES)
    # Not closed: what a SIGKILL now would leave.
    assert [(s["state"], s["reason"]) for s in read_spans(path)] == [("idle", NO_WORK), ("busy", "")]
    metrics.clock.close()
    assert [(s["state"], s["reason"]) for s in read_spans(path)][-1] == ("idle", WAITING_SAMPLES)


def test_a_heartbeat_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="heartbeat_s: must be > 0"):
        Timeline(tmp_path / "x.jsonl", heartbeat_s=0)
