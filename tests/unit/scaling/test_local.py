"""The local autoscaler's rounds: when it waits, what bounds it, which replica it drains.
Prometheus and the processes are small fakes here; tests/e2e/test_elastic.py runs the real ones."""

from __future__ import annotations

from dataclasses import dataclass

from streamrl.prometheus.api import PrometheusError
from streamrl.scaling.local import Fleet, LocalAutoscaler
from streamrl.spec import parse_job


@dataclass
class _FakeReplica:
    name: str
    pool: str
    alive: bool = True

    def running(self) -> bool:
        return self.alive


class _FakePrometheus:
    """Answers input_queries() with fixed stage times and the connected counts it is given."""

    def __init__(self):
        self.generator_utilisation, self.trainer_utilisation = 1.0, 0.4
        self.connected: dict[str, int] = {}
        self.down = False

    def query_all(self, exprs: dict[str, str]) -> dict[str, list[dict]]:
        if self.down:
            raise PrometheusError("cannot reach Prometheus at http://x: refused")

        def vec(v, **labels):
            return [{"metric": labels, "value": [0, str(v)]}]

        return {"iteration_s": vec(2.0), "generator_utilisation": vec(self.generator_utilisation),
                "trainer_utilisation": vec(self.trainer_utilisation), "iterations": vec(5), "idle_no_work": vec(0.0),
                "pool_samples_per_s": vec(10.0, pool="default"),
                "pool_connected": [r for p, n in self.connected.items() for r in vec(n, pool=p)]}


def _scaler(tmp_path, cores=8, max_replicas=4):
    job = parse_job({"metadata": {"name": "j"}, "spec": {
        "model": {"source": "builtin-tiny"},
        "generators": {"pools": [{"name": "default", "replicas": 1, "maxReplicas": max_replicas}]},
        "autoscaling": {"mode": "Internal", "intervalSeconds": 1, "behavior": {
            "scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 1}]},
            "scaleDown": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 1,
                                                                          "periodSeconds": 1}]}}}}})
    started, drained = [], []

    def start(pool):
        replica = _FakeReplica(f"{pool}-{len(started) + 1}", pool)
        started.append(replica)
        return replica

    fleet = Fleet(start, drained.append, [_FakeReplica("default-0", "default")])
    prom = _FakePrometheus()
    said = []
    return LocalAutoscaler(job, prom, fleet, cores, tmp_path, said.append), prom, started, drained, said


def test_adds_one_replica_then_waits_until_it_joined(tmp_path):
    scaler, prom, started, _, said = _scaler(tmp_path)
    prom.connected = {"default": 1}
    assert scaler.tick(100.0) is None  # settles: the window starts now
    assert scaler.tick(101.0) is None and scaler.last["reason"] == "measuring since the last change"
    decision = scaler.tick(102.0)
    assert decision.step == 1 and [r.name for r in started] == ["default-1"]
    assert said[-1].startswith("autoscaler: +1 default (default-1): generation-bound")
    assert scaler.tick(103.0) is None and "default 1/2" in scaler.last["reason"]  # not joined yet
    prom.connected = {"default": 2}
    assert scaler.tick(104.0) is None  # joined: a new window starts
    assert scaler.tick(105.0) is None
    assert scaler.tick(106.0).step == 1
    assert scaler.tick(106.5) is None  # not due (interval 1 s)


def test_cores_bound_the_replicas_as_well_as_max_replicas(tmp_path):
    scaler, prom, started, _, _ = _scaler(tmp_path, cores=2, max_replicas=4)
    scaler.fleet.replicas.append(_FakeReplica("default-x", "default"))
    prom.connected = {"default": 2}
    scaler.tick(100.0)
    decision = scaler.tick(102.0)
    assert decision.step == 0 and "every pool is at its maximum" in decision.reason and not started


def test_scale_down_drains_the_newest_replica_and_counts_it_gone_only_when_it_left(tmp_path):
    scaler, prom, _, drained, said = _scaler(tmp_path)
    newest = _FakeReplica("default-1", "default")
    scaler.fleet.replicas.append(newest)
    prom.connected = {"default": 2}
    prom.generator_utilisation, prom.trainer_utilisation = 0.2, 0.9  # training-bound: 0.4 s vs 1.8 s
    scaler.tick(100.0)
    decision = scaler.tick(102.0)
    assert decision.step == -1 and drained == [newest] and scaler.replicas() == {"default": 1}
    assert "(default-1 drains)" in said[-1]
    assert scaler.tick(103.0) is None and "default 2/1" in scaler.last["reason"]  # still connected, draining
    assert scaler.summary()["scale_downs"] == 1


def test_prometheus_down_is_reported_and_retried(tmp_path):
    scaler, prom, started, _, _ = _scaler(tmp_path)
    prom.down = True
    assert scaler.tick(100.0) is None and "cannot reach Prometheus" in scaler.last["reason"]
    prom.down, prom.connected = False, {"default": 1}
    scaler.tick(101.0)
    assert scaler.tick(103.0).step == 1 and len(started) == 1
    lines = (tmp_path / "autoscaling.jsonl").read_text().splitlines()
    assert len(lines) == 3 and '"step": 1' in lines[-1]
