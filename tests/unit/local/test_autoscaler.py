"""The local autoscaler's rounds: when it waits, what bounds it, which replica it drains.
Prometheus and the processes are small fakes here; tests/e2e/test_elastic.py runs the real ones."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from streamrl.local import RunFailed
from streamrl.local.autoscaler import NO_INPUTS_TIMEOUT_S, LocalAutoscaler, ReplicaProcesses
from streamrl.prometheus.api import PrometheusError
from streamrl.records import ScalingRecord
from streamrl.spec import parse_job


@dataclass
class _FakeReplica:
    name: str
    pool: str
    alive: bool = True
    returncode: int | None = None

    def running(self) -> bool:
        return self.alive


class _FakePrometheus:
    """Answers input_queries() with fixed stage times and the connected counts it is given."""

    url = "http://x"

    def __init__(self):
        self.generator_utilisation, self.trainer_utilisation = 1.0, 0.4
        self.connected: dict[str, int] = {}
        self.iterations = 5
        self.down = False

    def query_all(self, exprs: dict[str, str]) -> dict[str, list[dict]]:
        if self.down:
            raise PrometheusError("cannot reach Prometheus at http://x: refused")

        def vec(v, **labels):
            return [{"metric": labels, "value": [0, str(v)]}]

        return {"iteration_s": vec(2.0), "generator_utilisation": vec(self.generator_utilisation),
                "trainer_utilisation": vec(self.trainer_utilisation), "iterations": vec(self.iterations),
                "idle_no_work": vec(0.0),
                "pool_samples_per_s": vec(10.0, pool="default"),
                "pool_connected": [r for p, n in self.connected.items() for r in vec(n, pool=p)]}


def _scaler(tmp_path, cores=8, max_replicas=4, step=1):
    job = parse_job({"metadata": {"name": "j"}, "spec": {
        "model": {"source": "builtin-tiny"},
        "generators": {"pools": [{"name": "default", "replicas": 1, "maxReplicas": max_replicas}]},
        "autoscaling": {"mode": "Internal", "intervalSeconds": 1, "step": step, "behavior": {
            "scaleUp": {"policies": [{"type": "Pods", "value": step, "periodSeconds": 1}]},
            "scaleDown": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": step,
                                                                          "periodSeconds": 1}]}}}}})
    started, drained = [], []

    def start(pool):
        replica = _FakeReplica(f"{pool}-{len(started) + 1}", pool)
        started.append(replica)
        return replica

    processes = ReplicaProcesses(start, drained.append, [_FakeReplica("default-0", "default")])
    prom = _FakePrometheus()
    said = []
    return LocalAutoscaler(job, prom, processes, cores, tmp_path, said.append), prom, started, drained, said


def test_adds_one_replica_then_waits_until_it_joined(tmp_path):
    scaler, prom, started, _, said = _scaler(tmp_path)
    prom.connected = {"default": 1}
    assert scaler.tick(now=100.0) is None  # settles: the window starts now
    assert scaler.tick(now=101.0) is None and scaler.last.reason == "measuring since the last change"
    decision = scaler.tick(now=102.0)
    assert decision.step == 1 and [r.name for r in started] == ["default-1"]
    assert said[-1].startswith("autoscaler: +1 default (default-1): generation-bound")
    assert scaler.tick(now=103.0) is None and "default 1/2" in scaler.last.reason  # not joined yet
    prom.connected = {"default": 2}
    assert scaler.tick(now=104.0) is None  # joined: a new window starts
    assert scaler.tick(now=105.0) is None
    assert scaler.tick(now=106.0).step == 1
    assert scaler.tick(now=106.5) is None  # not due (interval 1 s)


def test_a_step_starts_and_drains_that_many_replicas(tmp_path):
    scaler, prom, started, drained, said = _scaler(tmp_path, max_replicas=5, step=2)
    prom.connected = {"default": 1}
    prom.trainer_utilisation = 0.2  # 2 s of generation, 0.4 s of training: two more leave 0.67 s
    scaler.tick(now=100.0)
    decision = scaler.tick(now=102.0)
    assert decision.step == 2 and [r.name for r in started] == ["default-1", "default-2"]
    assert said[-1].startswith("autoscaler: +2 default (default-1, default-2): generation-bound")
    assert scaler.replicas() == {"default": 3}
    prom.connected = {"default": 3}
    prom.generator_utilisation, prom.trainer_utilisation = 0.1, 0.9  # training-bound
    scaler.tick(now=170.0)  # past the cooldown (60 s) after the change
    for now in (172.0, 174.0, 176.0, 178.0):  # generation-bound no longer among the last three readings
        decision = scaler.tick(now=now)
    assert decision.step == -2 and [r.name for r in drained] == ["default-1", "default-2"]
    assert said[-1].startswith("autoscaler: -2 default (default-1, default-2 drain): training-bound")


def test_cores_bound_the_replicas_as_well_as_max_replicas(tmp_path):
    scaler, prom, started, _, _ = _scaler(tmp_path, cores=2, max_replicas=4)
    scaler.processes.replicas.append(_FakeReplica("default-x", "default"))
    prom.connected = {"default": 2}
    scaler.tick(now=100.0)
    decision = scaler.tick(now=102.0)
    assert decision.step == 0 and "every pool is at its maximum" in decision.reason and not started


def test_scale_down_drains_the_newest_replica_and_counts_it_gone_only_when_it_left(tmp_path):
    scaler, prom, _, drained, said = _scaler(tmp_path)
    newest = _FakeReplica("default-1", "default")
    scaler.processes.replicas.append(newest)
    prom.connected = {"default": 2}
    prom.generator_utilisation, prom.trainer_utilisation = 0.2, 0.9  # training-bound: 0.4 s vs 1.8 s
    scaler.tick(now=100.0)
    decision = scaler.tick(now=102.0)
    assert decision.step == -1 and drained == [newest] and scaler.replicas() == {"default": 1}
    assert "(default-1 drains)" in said[-1]
    assert scaler.tick(now=103.0) is None and "default 2/1" in scaler.last.reason  # still connected, draining
    assert scaler.summary().scale_downs == 1


def test_prometheus_down_is_reported_and_retried(tmp_path):
    scaler, prom, started, _, _ = _scaler(tmp_path)
    prom.down = True
    assert scaler.tick(now=100.0) is None and "cannot reach Prometheus" in scaler.last.reason
    prom.down, prom.connected = False, {"default": 1}
    scaler.tick(now=101.0)
    assert scaler.tick(now=103.0).step == 1 and len(started) == 1
    rounds = ScalingRecord.read_lines(tmp_path / "autoscaling.jsonl")
    assert [r.step for r in rounds] == [0, 0, 1] and rounds[-1].pool == "default"


def test_replicas_never_seen_connected_fail_the_run_once_the_bound_has_passed(tmp_path):
    scaler, prom, started, _, _ = _scaler(tmp_path)
    prom.connected = {}  # Prometheus answers, but shows no replica connected (the trainer not scraped)
    assert scaler.tick(now=100.0) is None
    assert scaler.tick(now=100.0 + NO_INPUTS_TIMEOUT_S) is None  # at the bound: still waiting
    with pytest.raises(RunFailed, match=r"no inputs for 301 s .*default 0/1 .*streamrl_pool_replicas"):
        scaler.tick(now=101.0 + NO_INPUTS_TIMEOUT_S)
    assert not started


def test_prometheus_answering_nothing_fails_the_run_and_inputs_restart_the_bound(tmp_path):
    scaler, prom, _, _, _ = _scaler(tmp_path)
    prom.down = True
    scaler.tick(now=100.0)
    prom.down, prom.connected = False, {"default": 1}
    scaler.tick(now=350.0)  # inputs: the bound starts again
    prom.down = True
    assert scaler.tick(now=600.0) is None and "cannot reach Prometheus" in scaler.last.reason
    with pytest.raises(RunFailed, match="cannot read the inputs: cannot reach Prometheus at http://x"):
        scaler.tick(now=651.0)


def test_waiting_for_iterations_is_not_a_lack_of_inputs(tmp_path):
    scaler, prom, _, _, _ = _scaler(tmp_path)
    prom.connected, prom.iterations = {"default": 1}, 0  # slow iterations: connected, measured, none finished
    for now in (100.0, 102.0, 100.0 + 2 * NO_INPUTS_TIMEOUT_S):
        assert scaler.tick(now=now) is None
    assert scaler.last.reason == "waiting for two iterations since the last change"


def test_once_a_replica_finishes_unasked_the_run_is_ending_and_no_round_decides(tmp_path):
    """The trainer tells the replicas the run is done and they exit 0 one by one; a round
    between that and the runner's stop must not read the emptied replica list as a decision."""
    scaler, prom, started, drained, _ = _scaler(tmp_path)
    prom.connected = {"default": 1}
    scaler.tick(now=100.0)
    assert scaler.tick(now=102.0).step == 1 and scaler.decided == {"default": 2}
    finished = scaler.processes.replicas[0]
    finished.alive, finished.returncode = False, 0
    prom.connected = {"default": 1}
    assert scaler.tick(now=103.0) is None and scaler.last.reason == "the run is ending: default-0 finished"
    started[0].alive, started[0].returncode = False, 0
    prom.connected = {}
    assert scaler.tick(now=104.0) is None and scaler.tick(now=110.0) is None
    assert scaler.summary().replicas_final == {"default": 2} and len(started) == 1 and not drained


def test_a_replica_that_crashed_is_no_end_of_the_run(tmp_path):
    scaler, prom, started, _, _ = _scaler(tmp_path)
    scaler.processes.replicas.append(crashed := _FakeReplica("default-1", "default", alive=False, returncode=-9))
    prom.connected = {"default": 1}
    scaler.tick(now=100.0)
    assert scaler.tick(now=102.0).step == 1 and not scaler.ending and crashed not in scaler.processes.replicas
