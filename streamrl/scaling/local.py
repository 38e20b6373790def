"""Elastic generators for `streamrl run` (`spec.autoscaling.mode: Internal`): every
`intervalSeconds` the scaling policy (streamrl.scaling) reads its inputs from the
run's own Prometheus, and a replica is started, or drained and stopped, one at a time.

Local bounds: a pool's `maxReplicas`, and the cores the run may use (generator threads,
the trainer sharing them). A replica being removed gets SIGTERM and drains: the trainer
assigns it nothing more, it finishes what it holds and exits 0, so nothing is lost or
counted twice. Every round is appended to `<out>/autoscaling.jsonl`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from streamrl.metrics import AutoscalerMetrics
from streamrl.prometheus.api import PrometheusAPI, PrometheusError
from streamrl.scaling.inputs import input_queries, parse_inputs, query_window_s
from streamrl.scaling.policy import Decision, State
from streamrl.scaling.round import scaling_round
from streamrl.spec import RLJob


class Replica(Protocol):
    name: str
    pool: str

    def running(self) -> bool: ...


@dataclass
class Fleet:
    """What the scaler may do to the run's generators (the runner implements it)."""

    start: Callable[[str], Replica]
    """Start one replica of the pool; returns it."""
    drain: Callable[[Replica], None]
    """Ask a replica to leave (SIGTERM): it drains and exits."""
    replicas: list[Replica] = field(default_factory=list)
    """Replicas running and not asked to leave."""


class LocalAutoscaler:
    def __init__(self, job: RLJob, prometheus: PrometheusAPI, fleet: Fleet, cores: int, out_dir: Path,
                 say: Callable[[str], None], metrics: AutoscalerMetrics | None = None):
        self.job = job
        self.spec = job.spec.autoscaling
        self.prometheus = prometheus
        self.fleet = fleet
        self.cores = cores
        self.say = say
        self.metrics = metrics or AutoscalerMetrics()
        self.state = State()
        self.log_path = out_dir / "autoscaling.jsonl"
        self._next_round = 0.0
        self._settled_at: float | None = None
        """When the replicas connected last matched the replicas asked for (None: not yet)."""
        self._last_reason = ""
        self.scale_ups = self.scale_downs = 0
        self.last: dict = {}
        self.decided = self.replicas()
        """Replicas per pool as of the last decision (processes exit once the run ends)."""

    def replicas(self) -> dict[str, int]:
        out = {p.name: 0 for p in self.job.spec.generators.pools}
        for r in self.fleet.replicas:
            out[r.pool] += 1
        return out

    def _room(self) -> dict[str, int]:
        """How many more replicas of each pool the cores left would take."""
        threads = {p.name: p.threads for p in self.job.spec.generators.pools}
        free = self.cores - sum(threads[p] * n for p, n in self.replicas().items())
        return {name: max(0, free) // n for name, n in threads.items()}

    def tick(self, now: float | None = None) -> Decision | None:
        """Run one round when it is due; returns the decision (None: not due, or waiting)."""
        now = time.time() if now is None else now
        if now < self._next_round:
            return None
        self._next_round = now + self.spec.interval_seconds
        self.fleet.replicas[:] = [r for r in self.fleet.replicas if r.running()]
        asked = self.replicas()
        try:
            inputs = parse_inputs(self.prometheus.query_all(input_queries(
                self.job.metadata.name, query_window_s(now, self._settled_at, self.spec.interval_seconds))))
        except PrometheusError as err:
            self._note(now, f"cannot read the inputs: {err}")
            return None
        rnd = scaling_round(self.spec, self.job.spec.generators, asked, inputs, self.state, self._settled_at, now,
                            self._room())
        self._settled_at, self.state = rnd.settled_at, rnd.state
        if rnd.waiting:
            self._note(now, {
                "connecting": "waiting for replicas to join or leave: " + ", ".join(
                    f"{p} {rnd.connected[p]}/{n}" for p, n in asked.items()),
                "measuring": "measuring since the last change",
                "iterations": "waiting for two iterations since the last change",
            }[rnd.waiting])
            return None
        decision, window = rnd.decision, rnd.window_s
        self.decided = decision.replicas
        self.metrics.record(self.job.metadata.name, decision.replicas, decision.step, decision.pool,
                            decision.trainer_bound)
        obs = inputs.observation
        self.last = {"time_unix": round(now, 3), "step": decision.step, "pool": decision.pool,
                     "replicas": decision.replicas, "reason": decision.reason, "trainer_bound": decision.trainer_bound,
                     "generation_s": round(obs.generation_s, 4), "train_s": round(obs.train_s, 4),
                     "idle_no_work": round(obs.idle_no_work, 4), "window_s": round(window, 1)}
        with self.log_path.open("a") as f:
            f.write(json.dumps(self.last) + "\n")
        if decision.step > 0:
            replica = self.fleet.start(decision.pool)
            self.fleet.replicas.append(replica)
            self.scale_ups += 1
            self.say(f"autoscaler: +1 {decision.pool} ({replica.name}): {decision.reason}")
        elif decision.step < 0:
            victim = [r for r in self.fleet.replicas if r.pool == decision.pool][-1]  # the newest
            self.fleet.replicas.remove(victim)
            self.fleet.drain(victim)
            self.scale_downs += 1
            self.say(f"autoscaler: -1 {decision.pool} ({victim.name} drains): {decision.reason}")
        elif decision.reason != self._last_reason and decision.trainer_bound:
            self.say(f"autoscaler: {decision.reason}")
        self._last_reason = decision.reason
        return decision

    def _note(self, now: float, why: str) -> None:
        self.last = {"time_unix": round(now, 3), "step": 0, "replicas": self.replicas(), "reason": why}
        with self.log_path.open("a") as f:
            f.write(json.dumps(self.last) + "\n")

    def summary(self) -> dict:
        return {"mode": self.spec.mode, "scale_ups": self.scale_ups, "scale_downs": self.scale_downs,
                "replicas_final": self.decided, "last": self.last}
