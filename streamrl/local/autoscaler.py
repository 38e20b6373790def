"""Elastic generators for `streamrl run` (`spec.autoscaling.mode: Internal`): every
`intervalSeconds` the scaling policy (streamrl.scaling) reads its inputs from the run's own
Prometheus, and a replica is started, or drained and stopped, one at a time.

Local bounds: a pool's `maxReplicas`, and the cores the run may use (generator threads,
the trainer sharing them). A replica being removed gets SIGTERM and drains: the trainer
assigns it nothing more, it finishes what it holds and exits 0, so nothing is lost or
counted twice. Every round is a ScalingRecord line of `<out>/autoscaling.jsonl`. Without
inputs for NO_INPUTS_TIMEOUT_S (Prometheus answering nothing, or the replicas asked for
never seen connected) it fails the run, naming why, rather than wait in silence.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from streamrl.admin import AdminServer
from streamrl.local import RunFailed
from streamrl.local.children import Child
from streamrl.local.launch import Services
from streamrl.local.monitor import RunMonitor
from streamrl.local.plan import RunPlan
from streamrl.metrics import AutoscalerMetrics
from streamrl.prometheus.api import PrometheusAPI, PrometheusError
from streamrl.records import SCALING_FILE, RunEvent, ScalingRecord, ScalingSummary, append_event
from streamrl.scaling.inputs import input_queries, parse_inputs, query_window_s
from streamrl.scaling.policy import Decision, State
from streamrl.scaling.round import scaling_round
from streamrl.spec import RLJob

NO_INPUTS_TIMEOUT_S = 300.0
"""How long the autoscaler may go without usable inputs before it fails the run: a replica
it starts may take STARTUP_TIMEOUT_S (180 s) to load on busy cores, then connect and be
scraped; a draining one finishes what it holds."""


def autoscale(plan: RunPlan, services: Services, monitor: RunMonitor, say: Callable[[str], None]) -> LocalAutoscaler:
    """The autoscaler of a running elastic job, over its generator processes, reading the
    run's Prometheus (`monitor`), which scrapes its admin server too."""
    def drain(replica: ReplicaProcess) -> None:
        assert isinstance(replica, Child)  # one the launcher started
        replica.proc.send_signal(signal.SIGTERM)

    processes = ReplicaProcesses(services.launcher.start, drain, list(services.launcher.children))
    scaler = LocalAutoscaler(plan.job, PrometheusAPI(monitor.url), processes, plan.cores, plan.out_dir, say)
    monitor.add("autoscaler", scaler.serve(), {"role": "autoscaler"})
    return scaler


class ReplicaProcess(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def pool(self) -> str: ...

    def running(self) -> bool: ...

    @property
    def returncode(self) -> int | None:
        """Its exit status once it exited (0: it finished, or drained when asked to)."""


@dataclass
class ReplicaProcesses:
    """What the scaler may do to the run's generators (the runner implements it)."""

    start: Callable[[str], ReplicaProcess]
    """Start one replica of the pool; returns it."""
    drain: Callable[[ReplicaProcess], None]
    """Ask a replica to leave (SIGTERM): it drains and exits."""
    replicas: list[ReplicaProcess] = field(default_factory=list)
    """Replicas running and not asked to leave."""


class LocalAutoscaler:
    """One round every `intervalSeconds` (tick), over its replica processes; its own /metrics
    and /status (serve) are scraped by the run's Prometheus like any process's."""

    def __init__(self, job: RLJob, prometheus: PrometheusAPI, processes: ReplicaProcesses, cores: int, out_dir: Path,
                 say: Callable[[str], None], metrics: AutoscalerMetrics | None = None,
                 no_inputs_timeout_s: float = NO_INPUTS_TIMEOUT_S):
        self.job = job
        self.spec = job.spec.autoscaling
        self.prometheus = prometheus
        self.processes = processes
        self.cores = cores
        self.say = say
        self.metrics = metrics or AutoscalerMetrics()
        self.no_inputs_timeout_s = no_inputs_timeout_s
        self.state = State()
        self.log_path = out_dir / SCALING_FILE
        self.admin: AdminServer | None = None
        self._next_round = 0.0
        self._settled_at: float | None = None
        """When the replicas connected last matched the replicas asked for (None: not yet)."""
        self._inputs_at: float | None = None
        """When a round last had its inputs: Prometheus answered and every replica asked for was connected."""
        self._last_reason = ""
        self.scale_ups = self.scale_downs = 0
        self.last: ScalingRecord | None = None
        self.decided = self.replicas()
        """Replicas per pool as of the last decision (processes exit once the run ends)."""
        self.ending = False
        """A replica finished without being asked to leave: the trainer told it the run is done,
        and no round decides any more (the others finish too; none is to be replaced)."""

    def serve(self, host: str = "127.0.0.1") -> str:
        """Start its admin server (/metrics, /status: the ScalingSummary); returns host:port."""
        self.admin = AdminServer(self.metrics.registry, self.summary, lambda: True, host, 0).start()
        return f"{host}:{self.admin.port}"

    def close(self) -> None:
        if self.admin is not None:
            self.admin.stop()
        self.prometheus.close()

    def replicas(self) -> dict[str, int]:
        out = {p.name: 0 for p in self.job.spec.generators.pools}
        for r in self.processes.replicas:
            out[r.pool] += 1
        return out

    def _room(self) -> dict[str, int]:
        """How many more replicas of each pool the cores left would take."""
        threads = {p.name: p.threads for p in self.job.spec.generators.pools}
        free = self.cores - sum(threads[p] * n for p, n in self.replicas().items())
        return {name: max(0, free) // n for name, n in threads.items()}

    def tick(self, say: Callable[[str], None] | None = None, now: float | None = None) -> Decision | None:
        """Run one round when it is due, printing through `say` from now on; returns the
        decision (None: not due, or waiting). RunFailed once it has gone
        NO_INPUTS_TIMEOUT_S without inputs."""
        self.say = say or self.say
        now = time.time() if now is None else now
        if now < self._next_round:
            return None
        self._next_round = now + self.spec.interval_seconds
        self._inputs_at = now if self._inputs_at is None else self._inputs_at
        finished = [r for r in self.processes.replicas if not r.running() and r.returncode == 0]
        self.processes.replicas[:] = [r for r in self.processes.replicas if r.running()]
        if finished and not self.ending:
            self.ending = True
            self._note(now, f"the run is ending: {', '.join(r.name for r in finished)} finished")
        if self.ending:
            return None
        asked = self.replicas()
        try:
            inputs = parse_inputs(self.prometheus.query_all(input_queries(
                self.job.metadata.name, query_window_s(now, self._settled_at, self.spec.interval_seconds))))
        except PrometheusError as err:
            return self._wait(now, f"cannot read the inputs: {err}")
        rnd = scaling_round(self.spec, self.job.spec.generators, asked, inputs, self.state, self._settled_at, now,
                            self._room())
        self._settled_at, self.state = rnd.settled_at, rnd.state
        if rnd.waiting == "connecting":
            return self._wait(now, "waiting for replicas to join or leave: " + ", ".join(
                f"{p} {rnd.connected[p]}/{n}" for p, n in asked.items()),
                f" (connected/asked for, as Prometheus at {self.prometheus.url} shows the trainer's "
                "streamrl_pool_replicas; is the trainer scraped?)")
        self._inputs_at = now
        if rnd.waiting:
            return self._note(now, {"measuring": "measuring since the last change",
                                    "iterations": "waiting for two iterations since the last change"}[rnd.waiting])
        decision, obs = rnd.decision, inputs.observation
        assert decision is not None and obs is not None and rnd.window_s is not None  # a round that decided
        self.decided = decision.replicas
        self.metrics.record(self.job.metadata.name, decision.replicas, decision.step, decision.pool,
                            decision.trainer_bound)
        self._append(ScalingRecord.of(decision, obs, rnd.window_s, now))
        if decision.step > 0:
            assert decision.pool is not None  # a step names its pool
            started = [self.processes.start(decision.pool) for _ in range(decision.step)]
            self.processes.replicas.extend(started)
            self.scale_ups += 1
            names = ", ".join(r.name for r in started)
            for replica in started:
                self._event(now, replica.name, f"+{decision.step} {decision.pool}: {decision.reason}")
            self.say(f"autoscaler: +{decision.step} {decision.pool} ({names}): {decision.reason}")
        elif decision.step < 0:
            victims = [r for r in self.processes.replicas if r.pool == decision.pool][decision.step:]  # the newest
            for victim in victims:
                self.processes.replicas.remove(victim)
                self.processes.drain(victim)
                self._event(now, victim.name, f"{decision.step} {decision.pool} (drains): {decision.reason}")
            self.scale_downs += 1
            names = ", ".join(r.name for r in victims)
            self.say(f"autoscaler: {decision.step} {decision.pool} ({names} drain{'s' * (len(victims) == 1)}): "
                     f"{decision.reason}")
        elif decision.reason != self._last_reason and decision.trainer_bound:
            self.say(f"autoscaler: {decision.reason}")
        self._last_reason = decision.reason
        return decision

    def _wait(self, now: float, why: str, detail: str = "") -> None:
        """A round without its inputs: noted, and the run failed once that has lasted too long."""
        self._note(now, why)
        assert self._inputs_at is not None  # tick sets it first
        if now - self._inputs_at > self.no_inputs_timeout_s:
            raise RunFailed(f"the autoscaler has had no inputs for {now - self._inputs_at:.0f} s "
                            f"(NO_INPUTS_TIMEOUT_S {self.no_inputs_timeout_s:.0f} s): {why}{detail}")

    def _note(self, now: float, why: str) -> None:
        self._append(ScalingRecord(time_unix=round(now, 3), step=0, replicas=self.replicas(), reason=why))

    def _event(self, now: float, process: str, detail: str) -> None:
        """A change applied, for the report's timeline and its table of events."""
        append_event(self.log_path.parent, RunEvent(time_unix=round(now, 3), kind="scaled", process=process,
                                                    detail=detail))

    def _append(self, record: ScalingRecord) -> None:
        self.last = record
        with self.log_path.open("a") as f:
            f.write(record.to_json() + "\n")

    def summary(self) -> ScalingSummary:
        return ScalingSummary(mode=self.spec.mode, scale_ups=self.scale_ups, scale_downs=self.scale_downs,
                              replicas_final=self.decided, last=self.last)
