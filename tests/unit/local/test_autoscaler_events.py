"""The local autoscaler writes each change it applies to events.jsonl (for the report's
timeline and its table of events), and nothing for a round that changed nothing."""

from __future__ import annotations

from streamrl.records import EVENTS_FILE, RunEvent
from tests.unit.local.test_autoscaler import _FakeReplica, _scaler


def test_a_replica_added_is_an_event_naming_it(tmp_path):
    scaler, prom, _, _, _ = _scaler(tmp_path)
    prom.connected = {"default": 1}
    scaler.tick(now=100.0)
    scaler.tick(now=101.0)  # measuring: no change, no event
    assert not (tmp_path / EVENTS_FILE).exists()
    assert scaler.tick(now=102.0).step == 1
    [event] = RunEvent.read_lines(tmp_path / EVENTS_FILE)
    assert (event.time_unix, event.kind, event.process) == (102.0, "scaled", "default-1")
    assert event.detail.startswith("+1 default: generation-bound")


def test_a_replica_drained_is_an_event_naming_it(tmp_path):
    scaler, prom, _, _, _ = _scaler(tmp_path)
    scaler.processes.replicas.append(_FakeReplica("default-7", "default"))
    prom.connected = {"default": 2}
    prom.generator_utilisation, prom.trainer_utilisation = 0.2, 0.9  # training-bound
    scaler.tick(now=100.0)
    assert scaler.tick(now=102.0).step == -1
    [event] = RunEvent.read_lines(tmp_path / EVENTS_FILE)
    assert (event.time_unix, event.kind, event.process) == (102.0, "scaled", "default-7")
    assert event.detail.startswith("-1 default (drains): ")


def test_a_round_at_the_maximum_writes_no_event(tmp_path):
    scaler, prom, started, _, _ = _scaler(tmp_path, cores=2)
    scaler.processes.replicas.append(_FakeReplica("default-x", "default"))
    prom.connected = {"default": 2}
    scaler.tick(now=100.0)
    assert scaler.tick(now=102.0).step == 0 and not started
    assert not (tmp_path / EVENTS_FILE).exists()
