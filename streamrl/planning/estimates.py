"""The planner's cost source: for each GPU type, a measured profile where one was given for
that type, the analytic roofline otherwise; the memory check always (a profile measured one
configuration, not what fits elsewhere)."""

from __future__ import annotations

from pathlib import Path

from streamrl.planning.catalog import GpuType
from streamrl.planning.costs import GenerationCost, TrainingCost
from streamrl.planning.demand import Workload
from streamrl.planning.planner import PlanJob
from streamrl.planning.profile import Profile
from streamrl.planning.roofline import Algorithm, Assumptions, analytic_generation_cost, analytic_training_cost
from streamrl.planning.shape import ModelShape


class Estimates:
    """A CostSource over one model, job and workload."""

    def __init__(self, shape: ModelShape, job: PlanJob, workload: Workload, algorithm: Algorithm = "grpo",
                 reference: bool = False, assumptions: Assumptions | None = None,
                 profiles: dict[str, tuple[Path, Profile]] | None = None):
        self.shape, self.job, self.workload = shape, job, workload
        self.algorithm, self.reference = algorithm, reference
        self.assumptions = assumptions or Assumptions()
        self.profiles = {k.lower(): v for k, v in (profiles or {}).items()}
        """GPU type -> (its file, the profile measured on it)."""
        self.model_name = shape.describe()
        self.weight_bytes = shape.num_params * self.assumptions.weight_bytes_per_param

    @property
    def max_context(self) -> int:
        return self.workload.prompt_tokens + self.job.max_new_tokens

    def describe(self, gpu: GpuType) -> str:
        measured = self.profiles.get(gpu.name.lower())
        return f"profile {measured[0]}" if measured else "roofline"

    def generation(self, gpu: GpuType, tp: int) -> GenerationCost | str:
        analytic = analytic_generation_cost(self.shape, gpu, tp, self.max_context, self.assumptions)
        problem = analytic.memory_problem()
        if problem:
            return problem
        measured = self.profiles.get(gpu.name.lower())
        if measured is None:
            return analytic
        if tp != 1:  # the engine profiled is one replica on one device
            return f"the profile of {gpu.name} measured one GPU per replica, not tensor-parallel {tp}"
        return measured[1].generation_cost()

    def training(self, gpu: GpuType, num_gpus: int) -> TrainingCost | str:
        analytic = analytic_training_cost(
            self.shape, gpu, num_gpus, self.workload.prompt_tokens + self.workload.mean_output,
            self.job.micro_batch_size, self.workload.prompt_tokens + self.job.max_new_tokens, self.algorithm,
            self.reference, self.assumptions)
        problem = analytic.memory_problem()
        if problem:
            return problem
        measured = self.profiles.get(gpu.name.lower())
        return measured[1].training_cost(num_gpus) if measured else analytic
