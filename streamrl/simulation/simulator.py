"""`streamrl simulate`: a run as discrete events, and its results. The trainer's loop here is the
product's, driven in simulated time: the rollout core's IterationPlanner (what goes out when,
predictions, the long-tail demand) and IterationTally (the take rule, the record's figures) over
fleet.py's rollout side. Not modelled: failures, stale drops (dispatch prevents them), the
ranker learning, the trainer's ranks (its cost covers them)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from streamrl.metrics import WAITING_GENERATORS, WAITING_SAMPLES
from streamrl.records import write_json
from streamrl.rollout.iteration import IterationFigures, IterationPlanner, IterationTally
from streamrl.rollout.work import InFlight, PromptWork
from streamrl.samples import micro_batches_by_length
from streamrl.simulation.autoscaler import SimAutoscaler
from streamrl.simulation.events import Simulation, Track
from streamrl.simulation.fleet import SimulatedFleet
from streamrl.simulation.outcome import ITERATIONS_FILE, SUMMARY_FILE, SimIteration, SimSummary, StageUse
from streamrl.simulation.replica import Sequence
from streamrl.simulation.scenario import Scenario
from streamrl.simulation.stages import Stages, generators_spec, resolve_stages
from streamrl.simulation.workload import SimWorkload
from streamrl.spec import PipelineMode


def padded_tokens(groups: list[InFlight[Sequence]], micro_batch_size: int) -> int:
    """Tokens the learner computes on for these groups: its micro-batches (the product's
    micro_batches_by_length), each padded to its longest."""
    sizes = [q.prompt_tokens + q.length for g in groups for q in g.in_order()]
    return sum(len(mb) * mb[-1] for mb in micro_batches_by_length(sizes, lambda n: n, micro_batch_size))


def micro_batches(groups: list[InFlight[Sequence]], micro_batch_size: int) -> int:
    """Micro-batches the learner cuts these groups' samples into (one accumulate call)."""
    return -(-sum(g.group_size for g in groups) // micro_batch_size)


@dataclass
class SimRun:
    summary: SimSummary
    iterations: list[SimIteration]
    tracks: list[Track]
    """The trainer's, then every generator replica's (departed ones included)."""


class Simulator:
    def __init__(self, scenario: Scenario, stages: Stages, base: Path | None = None):
        self.scenario, self.stages = scenario, stages
        self.sim = Simulation()
        algo = scenario.algorithm
        self.workload = SimWorkload(scenario.workload, algo.prompts_per_step, algo.group_size, scenario.seed, base)
        self.planner = IterationPlanner(scenario.pipeline, algo.num_iterations, algo.group_size, scenario.dispatch)
        self.fleet = SimulatedFleet(self.sim, scenario, stages, self.workload.typical_context(),
                                    demand=lambda: self.planner.demand)
        self.trainer = Track(self.sim, "trainer", "idle", WAITING_GENERATORS)
        self.iterations: list[SimIteration] = []
        self.autoscaler: SimAutoscaler | None = None
        """autoscaling.mode Internal: the product's scaling round over the fleet."""
        self.iteration_ends: list[tuple[float, float]] = []
        """(simulated time, wall seconds) of each finished iteration (the wall-seconds gauge's history)."""
        self.policy_version = 0
        self.done = False

    # ---- the trainer's loop (services/trainer/loop.py, TrainLoop) ------------------------
    def dispatch_due(self, training: int) -> None:
        """Hand out every iteration due before `training` trains (TrainLoop.dispatch_due)."""
        sc = self.scenario
        for j in self.planner.due(training):
            drawn = self.workload.iteration(j)
            prompts = [PromptWork(p.prompt_id, p.dataset_index, "", ()) for p in drawn]
            if sc.dispatch.policy != "random-fifo":  # predictions: the true mean (oracle) or the ranker's
                prompts = self.planner.predict(prompts, {p.prompt_id: p.mean_length if sc.dispatch.policy == "oracle"
                                                         else p.ranked_length for p in drawn})
            self.fleet.add_drawn(j, drawn, prompts, self.planner.min_policy_version(j))

    def _trainer_loop(self):
        sc, cost, fleet, track = self.scenario, self.stages.trainer, self.fleet, self.trainer
        algo = sc.algorithm
        for it in range(algo.num_iterations):
            tally = IterationTally.start(sc.pipeline, algo.prompts_per_step, algo.group_size, algo.micro_batch_size,
                                         self.sim.now, track.seconds("idle", WAITING_SAMPLES), self._skewness_s())
            self.dispatch_due(it)
            groups, train_s = [], 0.0
            while (want := tally.want()) is not None:
                need, most = want
                track.set("idle", WAITING_SAMPLES)
                while fleet.book.ready_samples(it) < need:
                    yield fleet.arrived
                got = fleet.book.take(it, most)
                for g in got:  # consumed: their lengths join D (TrainLoop._observe)
                    self.planner.observe([q.length for q in g.in_order()])
                groups.extend(got)
                tally.took(sum(g.group_size for g in got), self.sim.now)
                track.set("busy")
                if self.stages.to_training_s and len(groups) == len(got):  # colocated: the first take switches
                    yield from self._busy(self.stages.to_training_s)
                seconds = yield from self._busy(cost.train_s(padded_tokens(got, algo.micro_batch_size),
                                                             micro_batches(got, algo.micro_batch_size)))
                train_s += seconds
            train_s += yield from self._busy(cost.step_s())
            self.policy_version += 1
            yield from self._busy(cost.publish_s() + self.stages.to_generation_s)  # colocated: switch back
            fleet.publish(self.policy_version)
            track.set("idle", WAITING_SAMPLES)
            figures = tally.close(self.sim.now, track.seconds("idle", WAITING_SAMPLES), self._skewness_s(),
                                  len(fleet.replicas), [q.length for g in groups for q in g.in_order()],
                                  [self.policy_version - 1 - q.policy_version for g in groups for q in g.in_order()])
            self._record(it, tally.started, figures, train_s)
        self.done = True
        self.sim.stop()  # the run ends with its last iteration (versions still travelling do not count)

    def _busy(self, seconds: float):
        """The trainer works `seconds`, plus its intake of every sample that arrives meanwhile (its
        process takes them in between: trainer_sample_s each); returns the seconds it took."""
        per_sample, taken, total = self.stages.trainer_sample_s, self.fleet.num_arrived, seconds
        yield seconds
        while per_sample > 0 and self.fleet.num_arrived > taken:
            extra = (self.fleet.num_arrived - taken) * per_sample
            taken = self.fleet.num_arrived
            total += extra
            yield extra
        return total

    def _skewness_s(self) -> float:
        return sum(e.skewness_seconds() for e in self.fleet.engines.values()) + \
            sum(e.skewness_seconds() for e in self.fleet.departed)

    def _record(self, it: int, started: float, figures: IterationFigures, train_s: float) -> None:
        self.iterations.append(SimIteration(
            iteration=it, start_s=started, train_s=train_s, **asdict(figures),
            weight_sync_s_max=self.fleet.sync_s.get(it, 0.0), replicas=len(self.fleet.replicas)))
        self.iteration_ends.append((self.sim.now, figures.wall_s))

    # ---- the run ----------------------------------------------------------------------
    def run(self) -> SimRun:
        started = time.perf_counter()
        for pool in self.scenario.generators:
            for _ in range(pool.replicas):
                self.fleet.connect(pool.name)
        self.trainer.set("busy")
        self.sim.spawn(self._trainer_loop())
        sc = self.scenario
        if sc.autoscaling.mode == "Internal" and sc.pipeline.mode != PipelineMode.colocated:
            self.autoscaler = SimAutoscaler(self.fleet, sc.autoscaling, generators_spec(sc, self.stages),
                                            {p.name: p.join_seconds for p in sc.generators}, self.trainer,
                                            self.iteration_ends)
            self.sim.spawn(self.autoscaler.process())
        self.sim.run()
        if not self.done:
            raise RuntimeError(f"the simulation stalled at {self.sim.now:.3f}s: the trainer waits for samples no "
                               "replica will produce (every replica drained, or work needs a version never sent)")
        return SimRun(self._summary(time.perf_counter() - started), self.iterations, self._tracks())

    def _tracks(self) -> list[Track]:
        engines = sorted([*self.fleet.engines.values(), *self.fleet.departed],
                         key=lambda e: (e.track.started, int(e.generator_id.rsplit("-", 1)[1])))
        return [self.trainer] + [e.track for e in engines]

    def _summary(self, took_s: float) -> SimSummary:
        sc, its = self.scenario, self.iterations
        end = its[-1].start_s + its[-1].wall_s
        for engine in self.fleet.engines.values():
            engine.track.close()
        self.trainer.close()
        colocated = sc.pipeline.mode == PipelineMode.colocated
        scaling, joining = (self.autoscaler.decisions, self.autoscaler.joining) if self.autoscaler else ([], [])
        stages = [StageUse(name="trainer", gpus=self.stages.trainer_gpus,
                           utilisation=self.trainer.seconds("busy") / end if end else 0.0,
                           gpu_seconds=self.stages.trainer_gpus * end,
                           cost=self.stages.trainer_gpus * end / 3600 * self.stages.trainer_gpu_hour_cost)]
        engines = [*self.fleet.engines.values(), *self.fleet.departed]
        for pool in sc.generators:
            stage = self.stages.pools[pool.name]
            mine = [e for e in engines if e.pool == pool.name]
            held = sum(min(e.track.ended if e.track.ended is not None else end, end) - e.held_since for e in mine)
            held += sum(end - since for name, since in joining if name == pool.name)
            busy = sum(e.track.seconds("busy") for e in mine)
            gpu_s = 0.0 if colocated else held * stage.gpus_per_replica  # colocated: the trainer's GPUs
            stages.append(StageUse(name=pool.name, gpus=len(self.fleet.live(pool.name)) * stage.gpus_per_replica,
                                   utilisation=min(1.0, busy / held) if held else 0.0, gpu_seconds=gpu_s,
                                   cost=gpu_s / 3600 * stage.gpu_hour_cost))
        wall = sum(r.wall_s for r in its)
        samples = sum(r.num_samples for r in its)
        cost = sum(s.cost for s in stages)

        def weighted(key: str) -> float:
            return sum(getattr(r, key) * r.wall_s for r in its) / wall if wall else 0.0

        def mean(key: str) -> float:
            return sum(getattr(r, key) for r in its) / len(its)

        return SimSummary(
            scenario=sc.name, mode=sc.pipeline.mode.value, policy=sc.dispatch.policy, num_iterations=len(its),
            num_samples=samples, wall_s=wall, makespan_s=end, samples_per_s=samples / wall if wall else 0.0,
            iteration_s_mean=mean("wall_s"), generation_s_mean=mean("generation_s"), train_s_mean=mean("train_s"),
            pipeline_bubble_ratio=weighted("pipeline_bubble_ratio"),
            skewness_bubble_ratio=weighted("skewness_bubble_ratio"), stages=stages,
            gpu_seconds=sum(s.gpu_seconds for s in stages), cost=cost,
            samples_per_cost=samples / cost if cost else 0.0,
            weight_bytes_local=self.fleet.bytes_by_link["local"],
            weight_bytes_cross_datacenter=self.fleet.bytes_by_link["cross"],
            scaling=scaling, scale_ups=sum(r.step > 0 for r in scaling), scale_downs=sum(r.step < 0 for r in scaling),
            replicas_final={p.name: len(self.fleet.live(p.name)) for p in sc.generators},
            simulated_in_s=round(took_s, 3))


def simulate(scenario: Scenario, base: Path | None = None, stages: Stages | None = None) -> SimRun:
    """Simulate one scenario; ValueError naming a scenario field that cannot be resolved."""
    return Simulator(scenario, stages or resolve_stages(scenario, base), base).run()


def write_run(run: SimRun, out_dir: Path, gantt_rows: int = 24) -> list[Path]:
    """simulation.json, iterations.jsonl and gantt.png in out_dir."""
    from streamrl.simulation.gantt import write_gantt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / SUMMARY_FILE, run.summary)
    (out_dir / ITERATIONS_FILE).write_text("".join(r.to_json() + "\n" for r in run.iterations))
    gantt = write_gantt(out_dir / "gantt.png", run.tracks, run.iterations, run.summary, gantt_rows)
    return [out_dir / SUMMARY_FILE, out_dir / ITERATIONS_FILE, gantt]

