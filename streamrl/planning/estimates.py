"""The planner's cost source: for each GPU type, a measured profile where one was given for
that type, the analytic roofline otherwise; the memory check always (a profile measured one
configuration, not what fits elsewhere). The trainer's memory features are the job's, plus
whichever of activation checkpointing and CPU offload make it fit fastest where it does not.
Colocated switches are the roofline's always."""

from __future__ import annotations

from pathlib import Path

from streamrl.planning.catalog import GpuType
from streamrl.planning.costs import GenerationCost, SwitchCost, TrainerMemory, TrainingCost
from streamrl.planning.demand import LengthDistribution
from streamrl.planning.planner import PlanJob, trained_tokens
from streamrl.planning.profile_record import Profile
from streamrl.planning.roofline import (
    MEMORY_CHOICES,
    Algorithm,
    AnalyticSwitchCost,
    AnalyticTrainingCost,
    Assumptions,
    analytic_generation_cost,
    analytic_training_cost,
    tensor_parallel_problem,
)
from streamrl.planning.shape import ModelShape


class Estimates:
    """A CostSource over one model, job and workload."""

    def __init__(self, shape: ModelShape, job: PlanJob, workload: LengthDistribution, algorithm: Algorithm = "grpo",
                 reference: bool = False, assumptions: Assumptions | None = None,
                 profiles: dict[str, tuple[Path, Profile]] | None = None, memory: TrainerMemory | None = None):
        self.shape, self.job, self.workload = shape, job, workload
        self.memory = memory or TrainerMemory()
        """The job's own `trainer.memory`: always on; the planner may add the others."""
        self.algorithm: Algorithm = algorithm
        self.reference = reference
        self.assumptions = assumptions or Assumptions()
        self.profiles = {k.lower(): v for k, v in (profiles or {}).items()}
        """GPU type -> (its file, the profile measured on it)."""
        self.model_name = shape.describe()
        self.weight_bytes = shape.num_params * self.assumptions.weight_bytes_per_param
        self._training: dict[tuple[str, int], TrainingCost | str] = {}
        """training()'s answers: colocated switches ask for the trainer the planner has priced."""

    @property
    def max_context(self) -> int:
        return self.workload.prompt_tokens + self.job.max_new_tokens

    def describe(self, gpu: GpuType) -> str:
        measured = self.profiles.get(gpu.name.lower())
        return f"profile {measured[0]}" if measured else "roofline"

    def generation(self, gpu: GpuType, tp: int) -> GenerationCost | str:
        analytic = analytic_generation_cost(self.shape, gpu, tp, self.max_context, self.assumptions,
                                            self.workload.prompt_tokens)
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
        """The fastest trainer of `num_gpus` x `gpu` that fits, with the job's memory features and
        what else it needs (an AnalyticTrainingCost says which in its `memory`); else why not."""
        key = (gpu.name, num_gpus)
        if key not in self._training:
            self._training[key] = self._fastest_training(gpu, num_gpus)
        return self._training[key]

    def _fastest_training(self, gpu: GpuType, num_gpus: int) -> TrainingCost | str:
        choices = [self._analytic_training(gpu, num_gpus, m) for m in MEMORY_CHOICES
                   if m.covers(self.memory) and (num_gpus > 1 or not m.cpu_offload)  # offload shards over ranks
                   and tensor_parallel_problem(self.shape, gpu, num_gpus, m.tensor_parallel) is None]
        if not choices:  # the job's own tensor-parallel size does not divide these GPUs or the model
            return tensor_parallel_problem(self.shape, gpu, num_gpus, self.memory.tensor_parallel) or ""
        fits = [c for c in choices if c.memory_problem() is None]
        if not fits:
            return choices[-1].memory_problem() or ""  # the most memory-saving choice's arithmetic
        best = min(fits, key=self._busy_s)
        measured = self.profiles.get(gpu.name.lower())
        if measured and best.memory == self.memory:  # the profile measured the job's own trainer
            return measured[1].training_cost(num_gpus)
        return best

    def switch(self, gpu: GpuType, num_gpus: int, tp: int) -> SwitchCost | str:
        """Colocated on `num_gpus` x `gpu`, generating at tensor-parallel `tp`: the roofline's
        switches for the trainer training() picks (a profile measures one process on one
        device, which has no state to move), or why the trainer's state has nowhere to wait."""
        training = self.training(gpu, num_gpus)
        if isinstance(training, str):
            return training
        if not isinstance(training, AnalyticTrainingCost):
            training = self._analytic_training(gpu, num_gpus, self.memory)
        cost = AnalyticSwitchCost(training, analytic_generation_cost(self.shape, gpu, tp, self.max_context,
                                                                     self.assumptions, self.workload.prompt_tokens))
        return cost.memory_problem() or cost

    def memory_problem(self, gpu: GpuType, num_gpus: int) -> str | None:
        """Why the trainer with only the job's own memory features does not fit (None: it does)."""
        return tensor_parallel_problem(self.shape, gpu, num_gpus, self.memory.tensor_parallel) or \
            self._analytic_training(gpu, num_gpus, self.memory).memory_problem()

    def _analytic_training(self, gpu: GpuType, num_gpus: int, memory: TrainerMemory) -> AnalyticTrainingCost:
        return analytic_training_cost(
            self.shape, gpu, num_gpus, self.workload.prompt_tokens + self.workload.mean_output,
            self.job.micro_batch_size, self.workload.prompt_tokens + self.job.max_new_tokens, self.algorithm,
            self.reference, self.assumptions, memory)

    def _busy_s(self, cost: AnalyticTrainingCost) -> float:
        """The trainer's seconds per iteration: forward/backward, optimizer step, publishing."""
        return cost.train_s(*trained_tokens(self.job, self.workload)) + cost.step_s() + cost.publish_s()
