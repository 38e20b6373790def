"""The autoscaler of a simulated run: what the product's PromQL inputs would read from the
simulated counters, parsed and decided by the product's own scaling round; +1 starts a replica
(hello after joinSeconds), -1 drains the pool's newest, as `streamrl run`'s autoscaler does."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from streamrl.metrics import NO_WORK
from streamrl.records import ScalingRecord
from streamrl.scaling import inputs as scaling_inputs
from streamrl.scaling import round as scaling_rounds
from streamrl.scaling.policy import State
from streamrl.simulation.events import Track
from streamrl.simulation.fleet import SimulatedFleet
from streamrl.spec import AutoscalingSpec, GeneratorsSpec


@dataclass(frozen=True)
class _Counters:
    """Cumulative counters at one moment, as Prometheus would have scraped them."""

    replicas: dict[str, tuple[float, float, int]]
    """generator id -> (busy seconds, idle-for-no-work seconds, samples streamed)."""
    trainer_busy_s: float
    barrier_s: float


def _vector(value: float | None, now: float, **labels) -> list[dict]:
    return [] if value is None else [{"metric": labels, "value": [now, repr(float(value))]}]


class SimAutoscaler:
    """Every `autoscaling.intervalSeconds`, the product's scaling round over `fleet`, on what
    Prometheus would read: the replicas' and the barrier's tracks, the trainer's busy seconds
    and its iteration wall-seconds gauge (`iteration_ends`, as the trainer loop appends them).
    What it decides is in `decisions`; a replica it adds is in `joining` until it connects.
    Runs until the simulation stops (the trainer's last iteration stops it)."""

    def __init__(self, fleet: SimulatedFleet, spec: AutoscalingSpec, generators: GeneratorsSpec,
                 join_seconds: dict[str, float], trainer: Track, iteration_ends: list[tuple[float, float]]):
        self.sim, self.fleet = fleet.sim, fleet
        self.spec, self.generators, self.join_seconds = spec, generators, join_seconds
        self.trainer, self.iteration_ends = trainer, iteration_ends
        self.asked = {p.name: p.replicas for p in generators.pools}
        self.decisions: list[ScalingRecord] = []
        """The rounds that changed something (time_unix: simulated seconds)."""
        self.joining: list[tuple[str, float]] = []
        """(pool, when added) of replicas added that have not joined yet (their GPUs are paid)."""
        self.state = State()
        self.settled_at: float | None = None
        self.snapshots: list[tuple[float, _Counters]] = [(self.sim.now, self._counters())]

    def process(self):
        interval = float(self.spec.interval_seconds)
        while True:
            yield interval
            self.round()

    def round(self) -> None:
        now = self.sim.now
        self.snapshots.append((now, self._counters()))
        window = scaling_inputs.query_window_s(now, self.settled_at, self.spec.interval_seconds)
        inputs = scaling_inputs.parse_inputs(self._results(now, window))
        rnd = scaling_rounds.scaling_round(self.spec, self.generators, dict(self.asked), inputs, self.state,
                                           self.settled_at, now)
        self.settled_at, self.state = rnd.settled_at, rnd.state
        decision, obs = rnd.decision, inputs.observation
        if decision is None or not decision.step:
            return
        assert obs is not None and rnd.window_s is not None and decision.pool is not None  # a round that stepped
        self.decisions.append(ScalingRecord.of(decision, obs, rnd.window_s, now))
        self.asked[decision.pool] += decision.step
        if decision.step > 0:
            for _ in range(decision.step):
                self.joining.append((decision.pool, now))
                self.sim.after(self.join_seconds[decision.pool], self._join, decision.pool, now)
        else:
            for newest in self.fleet.live(decision.pool)[decision.step:]:
                self.fleet.drain(newest.generator_id)

    def _join(self, pool: str, added_at: float) -> None:
        self.joining.remove((pool, added_at))
        self.fleet.connect(pool, held_since=added_at)

    def _counters(self) -> _Counters:
        return _Counters({gid: (e.track.seconds("busy"), e.track.seconds("idle", NO_WORK), e.num_samples)
                          for gid, e in self.fleet.engines.items()},
                         self.trainer.seconds("busy"), self.fleet.barrier_track.seconds("busy"))

    def _gauge_mean(self, start: float, now: float) -> float | None:
        """avg_over_time of the iteration wall-seconds gauge (0 until the first iteration ends)."""
        ends = self.iteration_ends
        if not ends:
            return None
        times = [t for t, _ in ends]
        area, t = 0.0, start
        k = bisect_right(times, start)
        value = ends[k - 1][1] if k else 0.0
        for end_t, wall in ends[k:]:
            if end_t > now:
                break
            area += value * (end_t - t)
            t, value = end_t, wall
        area += value * (now - t)
        return area / (now - start) if now > start else value

    def _results(self, now: float, window: float) -> dict[str, list[dict]]:
        """What each of input_queries()'s PromQL expressions would return now over `window` seconds."""
        start = now - window
        k = max(0, bisect_right([t for t, _ in self.snapshots], start + 1e-9) - 1)
        base, current = self.snapshots[k][1], self.snapshots[-1][1]
        deltas = {gid: tuple(c - p for c, p in zip(v, base.replicas.get(gid, (0.0, 0.0, 0))))
                  for gid, v in current.replicas.items()}
        count = len(deltas)
        pool_of = {gid: e.pool for gid, e in self.fleet.engines.items()}
        out = {
            "iteration_s": _vector(self._gauge_mean(start, now), now),
            "generator_utilisation": _vector(sum(d[0] for d in deltas.values()) / window / count if count else None,
                                             now),
            "trainer_utilisation": _vector((current.trainer_busy_s - base.trainer_busy_s) / window, now),
            "iterations": _vector(sum(start < t <= now for t, _ in self.iteration_ends), now),
            "idle_no_work": _vector(max(0.0, sum(d[1] for d in deltas.values()) / window / count
                                        - (current.barrier_s - base.barrier_s) / window) if count else None, now),
            "pool_samples_per_s": [],
            "pool_connected": [],
        }
        for pool in self.asked:
            mine = [d for gid, d in deltas.items() if pool_of[gid] == pool]
            if mine:
                out["pool_samples_per_s"] += _vector(sum(d[2] for d in mine) / window / len(mine), now, pool=pool)
            connected = sum(r.pool == pool for r in self.fleet.replicas.values())
            out["pool_connected"] += _vector(connected, now, pool=pool) if connected else []
        return out
