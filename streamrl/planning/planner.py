"""Stage balancing (the paper's Algorithm 1): per stage a GPU type and count, the generators'
tensor-parallel size and replicas, so that generation time matches training time. One
datacenter: every split of its GPUs; two: each stage in its own, the faster side shrunk to
the fewest GPUs that keep up with the slower. Colocated: one set of GPUs takes turns, and the
iteration pays both stages and the two switches between them. Knows stage costs through
`CostSource` only."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from streamrl.planning.catalog import Catalog, GpuType
from streamrl.planning.costs import GenerationCost, SwitchCost, TrainerMemory, TrainingCost
from streamrl.planning.demand import LengthDistribution

Objective = Literal["time", "cost"]
Budget = dict[str, dict[str, int]]
"""Datacenter -> GPU type -> GPUs available."""
TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class PlanJob:
    """What of an RLJob the planner needs."""

    samples_per_iteration: int
    """prompts_per_step x group_size."""
    micro_batch_size: int
    max_new_tokens: int
    mode: str = "stream-sync"
    """The pipeline mode (`colocated`, `batch`, `stream-sync`, `stream-async`)."""

    def __post_init__(self):
        if self.mode not in ("colocated", "batch", "stream-sync", "stream-async"):
            raise ValueError(f"spec.pipeline.mode {self.mode!r}: expected colocated, batch, stream-sync or "
                             "stream-async")


@dataclass(frozen=True)
class Links:
    """How weights reach the generators."""

    network_gb_s: float = 25.0
    """Within a datacenter, GB/s (200 Gb/s RDMA-class networking; an assumption)."""
    cross_dc_gb_s: float = 1.25
    """Between datacenters, GB/s (a 10 Gb/s link; an assumption): one copy per version crosses it."""
    cross_dc_latency_s: float = 0.05
    """Round trip between datacenters, seconds."""


class CostSource(Protocol):
    """Stage costs per hardware choice, or why a choice does not fit (a str)."""

    weight_bytes: float
    """Bytes of the published weights (one version)."""

    def generation(self, gpu: GpuType, tp: int) -> GenerationCost | str: ...

    def training(self, gpu: GpuType, num_gpus: int) -> TrainingCost | str: ...

    def memory_problem(self, gpu: GpuType, num_gpus: int) -> str | None:
        """Why a trainer with only the job's own memory features does not fit (None: it does)."""
        ...

    def switch(self, gpu: GpuType, num_gpus: int, tp: int) -> SwitchCost | str:
        """Colocated mode's switches on `num_gpus` x `gpu` generating at `tp`, or why not."""
        ...

    def describe(self, gpu: GpuType) -> str:
        """Where this type's numbers come from (`roofline`, `profile FILE`)."""
        ...


@dataclass(frozen=True)
class StagePlan:
    stage: str
    """`generation` or `training`."""
    datacenter: str
    gpu: GpuType
    num_gpus: int
    seconds: float
    """Busy seconds per iteration (training: forward/backward, optimizer step and publishing)."""
    source: str
    tp: int = 1
    replicas: int = 0
    max_batch: int = 0
    memory: TrainerMemory | None = None
    """Training: the memory features the trainer was priced with (None: the cost does not say)."""
    memory_reason: str = ""
    """Training: why the job's own memory features were not enough, where the plan adds some."""

    @property
    def cost(self) -> float:
        """Relative cost per unit of time held."""
        return self.num_gpus * self.gpu.relative_cost


@dataclass(frozen=True)
class Plan:
    generation: StagePlan
    training: StagePlan
    iteration_s: float
    samples_per_iteration: int
    weight_sync_s: float
    mode: str
    objective: Objective
    released: Budget = field(default_factory=dict)
    """GPUs of the budget the plan does not use, per datacenter and type."""
    to_training_s: float = 0.0
    """Colocated: seconds per iteration of switching from generation to training."""
    to_generation_s: float = 0.0
    """Colocated: seconds per iteration of switching back (state out, weights resharded, cache)."""

    @property
    def colocated(self) -> bool:
        return self.mode == "colocated"

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_iteration / self.iteration_s

    @property
    def cost(self) -> float:
        """Relative cost per unit of time (colocated: the one set of GPUs both stages share)."""
        return self.training.cost if self.colocated else self.generation.cost + self.training.cost

    @property
    def samples_per_s_per_cost(self) -> float:
        return self.samples_per_s / self.cost

    def utilisation(self, stage: StagePlan) -> float:
        return min(1.0, stage.seconds / self.iteration_s)


def generation_s(cost: GenerationCost, replicas: int, workload: LengthDistribution, num_samples: int) -> float:
    """Seconds until the slowest replica's last sample: samples spread evenly, each replica
    decoding in continuous batches of up to max_batch, longest first. In decode steps that is
    max(its tokens / batch, the iteration's longest output); the steps run at the mean
    occupancy (tokens / steps) and the workload's mean decode context; plus its prefill."""
    per_replica = math.ceil(num_samples / replicas)
    batch = min(cost.max_batch, per_replica)
    tokens = per_replica * workload.mean_output
    steps = max(tokens / batch, workload.expected_longest(num_samples))
    occupancy = max(1, math.ceil(tokens / steps))
    decode = steps * cost.decode_step_s(occupancy, round(workload.mean_decode_context))
    return cost.prefill_s(per_replica * workload.prompt_tokens) + decode


def trained_tokens(job: PlanJob, workload: LengthDistribution) -> tuple[int, int]:
    """An iteration's trained tokens (each sample's prompt and mean output) and its micro-batches
    over every rank."""
    tokens = round(job.samples_per_iteration * (workload.prompt_tokens + workload.mean_output))
    return tokens, -(-job.samples_per_iteration // job.micro_batch_size)


@dataclass(frozen=True)
class _Training:
    fb_s: float
    micro_batch_s: float
    step_s: float
    publish_s: float
    memory: TrainerMemory | None = None
    memory_reason: str = ""

    @property
    def busy_s(self) -> float:
        return self.fb_s + self.step_s + self.publish_s


def iteration_s(mode: str, gen_s: float, train: _Training, sync_s: float) -> float:
    """batch and colocated: the stages in turn (`sync_s`: colocated's two switches). stream-sync:
    training overlaps generation (its last micro-batch after the last sample), then step,
    publish and the weight transfer. stream-async: the stages overlap entirely, the transfer
    too; the slowest sets the pace."""
    if mode in ("batch", "colocated"):
        return gen_s + train.busy_s + sync_s
    if mode == "stream-sync":
        return max(gen_s + train.micro_batch_s, train.fb_s) + train.step_s + train.publish_s + sync_s
    return max(gen_s, train.busy_s, sync_s)


def train_counts(gpu: GpuType, limit: int) -> list[int]:
    """Trainer sizes a job can have: up to one node's GPUs, then whole nodes."""
    n = gpu.gpus_per_node
    return [y for y in range(1, min(n, limit) + 1)] + [k * n for k in range(2, limit // n + 1)]


@dataclass(frozen=True)
class _Candidate:
    gen_dc: str
    gen_gpu: GpuType
    tp: int
    replicas: int
    gen_s: float
    train_dc: str
    train_gpu: GpuType
    train_gpus: int
    train: _Training
    sync_s: float
    iteration_s: float
    switch: SwitchCost | None = None
    """Colocated: the stages share the trainer's GPUs and switch twice per iteration."""

    @property
    def cost(self) -> float:
        trainer = self.train_gpus * self.train_gpu.relative_cost
        return trainer if self.switch else self.replicas * self.tp * self.gen_gpu.relative_cost + trainer

    @property
    def num_gpus(self) -> int:
        return self.train_gpus if self.switch else self.replicas * self.tp + self.train_gpus


class Planner:
    def __init__(self, catalog: Catalog, costs: CostSource, job: PlanJob, workload: LengthDistribution,
                 links: Links | None = None, tolerance: float = 0.01):
        self.catalog, self.costs, self.job, self.workload = catalog, costs, job, workload
        self.links = links or Links()
        self.tolerance = tolerance
        """Iteration times within this fraction of the best count as equal (the cheaper plan wins)."""
        self._gen_s: dict[tuple[str, int, int], float] = {}
        self._train: dict[tuple[str, int], _Training | str] = {}

    def plan(self, budget: Budget, objective: Objective = "time") -> Plan:
        """The best plan within `budget`; ValueError naming what does not fit where."""
        budget = self._checked(budget)
        candidates = list(self._candidates(budget))
        if not candidates:
            raise ValueError(self._why_nothing_fits(budget))
        if objective == "time":
            best_s = min(c.iteration_s for c in candidates)
            close = [c for c in candidates if c.iteration_s <= best_s * (1 + self.tolerance)]
            best = min(close, key=lambda c: (c.cost, c.num_gpus, c.iteration_s))
        else:
            best = max(candidates, key=lambda c: (1 / (c.iteration_s * c.cost), -c.iteration_s))
        return self._plan_of(best, budget, objective)

    # ---- the search -------------------------------------------------------------------
    def _checked(self, budget: Budget) -> Budget:
        if not 1 <= len(budget) <= 2:
            raise ValueError(f"--gpus names {len(budget)} datacenters ({', '.join(budget)}); the planner "
                             "handles one or two")
        out: Budget = {}
        for dc, types in budget.items():
            out[dc] = {}
            for name, count in types.items():
                gpu = self.catalog.gpu(name, field="--gpus" if len(budget) == 1 else f"--gpus (datacenter {dc})")
                if count < 1:
                    raise ValueError(f"--gpus {name}={count}: a count must be at least 1")
                out[dc][gpu.name] = out[dc].get(gpu.name, 0) + count
        return out

    def _candidates(self, budget: Budget) -> Iterator[_Candidate]:
        if self.job.mode == "colocated":
            yield from self._colocated(budget)
            return
        dcs = list(budget)
        pairs = [(dcs[0], dcs[0])] if len(dcs) == 1 else [(dcs[0], dcs[1]), (dcs[1], dcs[0])]
        for gen_dc, train_dc in pairs:
            link_gb_s = self.links.network_gb_s if gen_dc == train_dc else self.links.cross_dc_gb_s
            sync_s = self.costs.weight_bytes / (link_gb_s * 1e9)
            sync_s += self.links.cross_dc_latency_s if gen_dc != train_dc else 0.0
            for gen_name, gen_avail in budget[gen_dc].items():
                gen_gpu = self.catalog.gpu(gen_name)
                for tp in (t for t in TP_SIZES if t <= min(gen_avail, gen_gpu.gpus_per_node)):
                    gen_cost = self.costs.generation(gen_gpu, tp)
                    if isinstance(gen_cost, str) or gen_cost.max_batch < 1:
                        continue
                    for train_name, train_avail in budget[train_dc].items():
                        train_gpu = self.catalog.gpu(train_name)
                        shared = gen_dc == train_dc and gen_name == train_name
                        for replicas in range(1, gen_avail // tp + 1):
                            left = train_avail - (replicas * tp if shared else 0)
                            if left < 1:
                                break
                            gen_s = self._generation_s(gen_cost, gen_gpu, tp, replicas)
                            for y in train_counts(train_gpu, left):
                                train = self._training(train_gpu, y)
                                if isinstance(train, str):
                                    continue
                                yield _Candidate(gen_dc, gen_gpu, tp, replicas, gen_s, train_dc, train_gpu, y, train,
                                                 sync_s, iteration_s(self.job.mode, gen_s, train, sync_s))

    def _colocated(self, budget: Budget) -> Iterator[_Candidate]:
        """Every GPU trains and, as one shard of a tp-GPU replica, generates: per type, count
        (a trainer's) and tensor-parallel size dividing it."""
        if len(budget) != 1:
            raise ValueError(f"--gpus names {len(budget)} datacenters; colocated generation and training share "
                             "one set of GPUs, so name one")
        (dc, types), = budget.items()
        for name, avail in types.items():
            gpu = self.catalog.gpu(name)
            for tp in (t for t in TP_SIZES if t <= min(avail, gpu.gpus_per_node)):
                gen_cost = self.costs.generation(gpu, tp)
                if isinstance(gen_cost, str) or gen_cost.max_batch < 1:
                    continue
                for n in (y for y in train_counts(gpu, avail) if y % tp == 0):
                    train = self._training(gpu, n)
                    if isinstance(train, str):
                        continue
                    switch = self.costs.switch(gpu, n, tp)
                    if isinstance(switch, str):
                        continue
                    gen_s = self._generation_s(gen_cost, gpu, tp, n // tp)
                    switch_s = switch.to_training_s() + switch.to_generation_s()
                    yield _Candidate(dc, gpu, tp, n // tp, gen_s, dc, gpu, n, train, 0.0,
                                     iteration_s("colocated", gen_s, train, switch_s), switch)

    def _generation_s(self, cost: GenerationCost, gpu: GpuType, tp: int, replicas: int) -> float:
        key = (gpu.name, tp, replicas)
        if key not in self._gen_s:
            self._gen_s[key] = generation_s(cost, replicas, self.workload, self.job.samples_per_iteration)
        return self._gen_s[key]

    def _training(self, gpu: GpuType, num_gpus: int) -> _Training | str:
        key = (gpu.name, num_gpus)
        if key not in self._train:
            cost = self.costs.training(gpu, num_gpus)
            if isinstance(cost, str):
                self._train[key] = cost
            else:
                tokens, batches = trained_tokens(self.job, self.workload)
                sample_tokens = self.workload.prompt_tokens + self.workload.mean_output
                micro = round(min(self.job.micro_batch_size * num_gpus, self.job.samples_per_iteration) * sample_tokens)
                self._train[key] = _Training(cost.train_s(tokens, batches), cost.train_s(micro, min(num_gpus, batches)),
                                             cost.step_s(), cost.publish_s(), getattr(cost, "memory", None),
                                             self.costs.memory_problem(gpu, num_gpus) or "")
        return self._train[key]

    def _why_nothing_fits(self, budget: Budget) -> str:
        """The first stage that fits nowhere in the budget, with each type's reason."""
        name = getattr(self.costs, "model_name", "the model")
        gen_reasons, train_reasons = [], []
        for dc, types in budget.items():
            for gpu_name, avail in types.items():
                gpu = self.catalog.gpu(gpu_name)
                tps = [t for t in TP_SIZES if t <= min(avail, gpu.gpus_per_node)]
                tried = [self.costs.generation(gpu, tp) for tp in tps]
                if not any(not isinstance(g, str) and g.max_batch >= 1 for g in tried):
                    largest = tried[-1]  # the most memory a replica can have here
                    why = largest if isinstance(largest, str) else f"no room for a KV cache at tp {tps[-1]}"
                    gen_reasons.append(f"{dc}/{gpu_name}: {why}")
                t = self._training(gpu, avail)
                if isinstance(t, str):
                    least = next((y for y in train_counts(gpu, 1 << 16) if not isinstance(self._training(gpu, y), str)),
                                 None)
                    enough = f"; at least {least} x {gpu_name} would hold it" if least else ""
                    train_reasons.append(f"{dc}/{gpu_name}: {t}{enough}")
        if len(gen_reasons) == sum(len(t) for t in budget.values()):
            return f"budget too small for {name}: no generator replica fits\n  " + "\n  ".join(gen_reasons)
        if len(train_reasons) == sum(len(t) for t in budget.values()):
            return f"budget too small for {name}: the trainer fits nowhere\n  " + "\n  ".join(train_reasons)
        if self.job.mode == "colocated":
            reasons = []
            for dc, types in budget.items():
                for gpu_name, avail in types.items():
                    gpu = self.catalog.gpu(gpu_name)
                    why = self.costs.switch(gpu, avail, 1)
                    if isinstance(why, str):
                        reasons.append(f"{dc}/{gpu_name}: {why}")
            return (f"budget too small for {name} colocated: no count of {_describe(budget)} both trains and holds a "
                    "generator replica" + "".join(f"\n  {r}" for r in gen_reasons + train_reasons + reasons))
        return (f"budget too small for {name}: no split of {_describe(budget)} holds both a generator replica and "
                "the trainer" + ("\n  " + "\n  ".join(gen_reasons + train_reasons) if gen_reasons or train_reasons
                                 else ""))

    def _plan_of(self, c: _Candidate, budget: Budget, objective: Objective) -> Plan:
        gen = StagePlan("generation", c.gen_dc, c.gen_gpu, c.replicas * c.tp, c.gen_s,
                        self.costs.describe(c.gen_gpu), c.tp, c.replicas, self._max_batch(c))
        train = StagePlan("training", c.train_dc, c.train_gpu, c.train_gpus, c.train.busy_s,
                          self.costs.describe(c.train_gpu), memory=c.train.memory, memory_reason=c.train.memory_reason)
        released: Budget = {dc: dict(types) for dc, types in budget.items()}
        if not c.switch:
            released[c.gen_dc][c.gen_gpu.name] -= gen.num_gpus
        released[c.train_dc][c.train_gpu.name] -= train.num_gpus
        released = {dc: {t: n for t, n in types.items() if n} for dc, types in released.items()}
        return Plan(gen, train, c.iteration_s, self.job.samples_per_iteration, c.sync_s, self.job.mode, objective,
                    {dc: types for dc, types in released.items() if types},
                    c.switch.to_training_s() if c.switch else 0.0, c.switch.to_generation_s() if c.switch else 0.0)

    def _max_batch(self, c: _Candidate) -> int:
        cost = self.costs.generation(c.gen_gpu, c.tp)
        assert not isinstance(cost, str)
        return cost.max_batch


def _describe(budget: Budget) -> str:
    return "; ".join(f"{dc}: " + ", ".join(f"{n} x {t}" for t, n in types.items()) for dc, types in budget.items())
