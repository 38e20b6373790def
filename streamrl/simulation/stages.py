"""A scenario's stages resolved: each pool's GenerationCost, GPUs and price, the trainer's
TrainingCost, per-sample and weight-load seconds, a weight version's bytes, from a table, a
measured profile or the roofline; the pools priced as the scaling round reads them. Knows where
seconds come from, not when they are spent."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from streamrl.planning.catalog import Catalog, load_catalog
from streamrl.planning.costs import GenerationCost, LinearTrainingCost, TrainerMemory, TrainingCost
from streamrl.planning.profile_record import load_profile
from streamrl.planning.roofline import (
    AnalyticGenerationCost,
    AnalyticSwitchCost,
    Assumptions,
    analytic_generation_cost,
    analytic_training_cost,
    tensor_parallel_problem,
)
from streamrl.planning.shape import ModelShape
from streamrl.rollout.longtail import LatencyProfile
from streamrl.simulation.scenario import (
    AnalyticGeneration,
    AnalyticTraining,
    ProfileCost,
    Scenario,
    TableGeneration,
    TableTraining,
    scenario_path,
)
from streamrl.spec import GeneratorPoolSpec, GeneratorsSpec, PipelineMode


@dataclass(frozen=True)
class TableGenerationCost:
    """PTL(BS) from points, interpolated as the long-tail planner does, plus a per-context-token
    term (a GenerationCost)."""

    ptl: LatencyProfile
    context_s_per_token: float
    prefill_s_per_token: float
    max_batch: int
    prefill_s_per_step: float = 0.0

    def decode_step_s(self, batch: int, context: int) -> float:
        return self.ptl.ptl(batch) + batch * context * self.context_s_per_token

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_s_per_step + tokens * self.prefill_s_per_token


@dataclass(frozen=True)
class PoolStage:
    cost: GenerationCost
    gpus_per_replica: int
    gpu_hour_cost: float
    max_batch: int
    """The cost's max_batch, or the pool's maxBatchSize when lower."""
    sample_s: float = 0.0
    """Seconds a replica spends per sample it finishes besides decoding, before its next step."""
    load_s: float = 0.0
    """Seconds a replica pauses to swap a fetched version in."""


@dataclass(frozen=True)
class Stages:
    pools: dict[str, PoolStage]
    trainer: TrainingCost
    trainer_gpus: int
    trainer_gpu_hour_cost: float
    weight_bytes: float
    trainer_sample_s: float = 0.0
    """Seconds the trainer's process spends per sample it takes in (delaying its training when busy)."""
    to_training_s: float = 0.0
    """Colocated: seconds from an iteration's last sample to its first micro-batch."""
    to_generation_s: float = 0.0
    """Colocated: seconds from the published version to generating again."""


def model_shape(scenario: Scenario, catalog: Catalog, base: Path | None = None) -> ModelShape | None:
    if scenario.model is None:
        return None
    if scenario.model.endswith(".json") or "/" in scenario.model:
        return ModelShape.from_hf_config(scenario_path(scenario.model, base))
    return catalog.model(scenario.model)


def resolve_stages(scenario: Scenario, base: Path | None = None, catalog: Catalog | None = None) -> Stages:
    """Every stage's costs; ValueError naming the scenario field that cannot be resolved."""
    needs_catalog = any(isinstance(p.cost, AnalyticGeneration) for p in scenario.generators) or \
        isinstance(scenario.trainer.cost, AnalyticTraining) or (scenario.model and not scenario.model.endswith(".json"))
    catalog = catalog or (load_catalog() if needs_catalog else Catalog([], []))
    shape = model_shape(scenario, catalog, base)
    try:
        assumptions = Assumptions(**scenario.assumptions)
    except ValueError as err:
        raise ValueError(f"assumptions: {err}") from None
    w = scenario.workload
    colocated = scenario.pipeline.mode == PipelineMode.colocated
    pools = {}
    for i, pool in enumerate(scenario.generators):
        where = f"generators[{i}].cost"
        spec, gpus, price, sample_s, load_s = pool.cost, 1, 1.0, 0.0, 0.0
        if isinstance(spec, TableGeneration):
            cost = TableGenerationCost(LatencyProfile(tuple(spec.decode_step_seconds)), spec.context_seconds_per_token,
                                       spec.prefill_seconds_per_token, spec.max_batch_size,
                                       spec.prefill_seconds_per_step)
            sample_s = spec.sample_seconds
        elif isinstance(spec, ProfileCost):
            profile = _profile(spec, base, where)
            cost = profile.generation_cost()
            sample_s = 0.0 if colocated else profile.sample_send_s()  # colocated: no wire
            load_s = profile.weight_load_s
        else:
            if shape is None:
                raise ValueError(f"{where}: an analytic cost needs the scenario's `model` (a catalog name or a "
                                 "config.json)")
            gpu = catalog.gpu(spec.gpu, f"{where}.gpu")
            cost = analytic_generation_cost(shape, gpu, spec.tensor_parallel, w.prompt_tokens + w.max_new_tokens,
                                            assumptions, w.prompt_tokens)
            problem = cost.memory_problem()
            if problem or cost.max_batch < 1:
                raise ValueError(f"{where}: {problem or 'no sequence fits beside the weights'}")
            gpus, price = spec.tensor_parallel, gpu.relative_cost
        cap = min(cost.max_batch, pool.max_batch_size or cost.max_batch)
        if scenario.weights.load_seconds is not None:
            load_s = scenario.weights.load_seconds
        pools[pool.name] = PoolStage(cost, pool.gpus_per_replica or gpus, pool.gpu_hour_cost or price, cap,
                                     sample_s, load_s)
    t = scenario.trainer
    spec, price, trainer_sample_s, switch = t.cost, 1.0, 0.0, (0.0, 0.0)
    if isinstance(spec, TableTraining):
        trainer = LinearTrainingCost(spec.seconds_per_token, spec.step_seconds, spec.publish_seconds,
                                     spec.micro_batch_seconds)
        trainer_sample_s = spec.sample_seconds
        if colocated:
            switch = spec.switch_to_training_seconds, spec.switch_to_generation_seconds
    elif isinstance(spec, ProfileCost):
        profile = _profile(spec, base, "trainer.cost")
        trainer = profile.training_cost(t.gpus)
        trainer_sample_s = profile.sample_colocated_cost_s() if colocated else profile.sample_receive_s()
        if colocated:
            measured = profile.switch_cost()
            switch = measured.to_training_s(), measured.to_generation_s()
    else:
        if shape is None:
            raise ValueError("trainer.cost: an analytic cost needs the scenario's `model`")
        gpu = catalog.gpu(spec.gpu, "trainer.cost.gpu")
        mean_tokens = w.prompt_tokens + min(w.max_new_tokens, getattr(w.lengths, "median", w.max_new_tokens / 4))
        trainer = analytic_training_cost(shape, gpu, t.gpus, mean_tokens, scenario.algorithm.micro_batch_size,
                                         w.prompt_tokens + w.max_new_tokens, spec.algorithm, spec.reference,
                                         assumptions, TrainerMemory(spec.activation_checkpointing, spec.cpu_offload,
                                                                    spec.tensor_parallel))
        problem = tensor_parallel_problem(shape, gpu, t.gpus, spec.tensor_parallel) or trainer.memory_problem()
        if problem:
            raise ValueError(f"trainer.cost: {problem} (trainer.cost.activationCheckpointing and cpuOffload trade "
                             "time for memory)")
        price = gpu.relative_cost
        if colocated:  # the engine a GPU also holds: the first pool's, or one GPU's of the trainer's type
            engine = next((p.cost for p in pools.values() if isinstance(p.cost, AnalyticGenerationCost)), None)
            engine = engine or analytic_generation_cost(shape, gpu, 1, w.prompt_tokens + w.max_new_tokens, assumptions,
                                                        w.prompt_tokens)
            analytic = AnalyticSwitchCost(trainer, engine)
            problem = analytic.memory_problem()
            if problem:
                raise ValueError(f"trainer.cost: {problem}")
            switch = analytic.to_training_s(), analytic.to_generation_s()
    size = scenario.weights.size_bytes
    if size is None:
        if shape is None:
            raise ValueError("weights.sizeBytes: required when the scenario names no `model`")
        size = shape.num_params * assumptions.weight_bytes_per_param
    if colocated:  # one process: the trainer takes each sample in between the replica's steps, while it waits
        pools = {name: replace(stage, sample_s=stage.sample_s + trainer_sample_s) for name, stage in pools.items()}
        trainer_sample_s = 0.0
    return Stages(pools, trainer, t.gpus, t.gpu_hour_cost or price, float(size), trainer_sample_s, *switch)


def _profile(spec: ProfileCost, base: Path | None, where: str):
    try:
        return load_profile(scenario_path(spec.path, base))
    except ValueError as err:
        raise ValueError(f"{where}.path: {err}") from None


def generators_spec(scenario: Scenario, stages: Stages) -> GeneratorsSpec:
    """The pools as an RLJob's `generators` (what the autoscaling round reads: bounds and a
    replica's cost, its GPUs' hourly price)."""
    return GeneratorsSpec(pools=[GeneratorPoolSpec(
        name=p.name, replicas=p.replicas, min_replicas=p.min_replicas, max_replicas=p.max_replicas,
        cost=stages.pools[p.name].gpus_per_replica * stages.pools[p.name].gpu_hour_cost) for p in scenario.generators])
