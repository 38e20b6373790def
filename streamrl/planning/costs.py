"""What one stage costs in seconds, the seam between where times come from (a measured
profile, or the analytic roofline over a catalog GPU) and who uses them (the planner, the
simulator). Both sides see only these two protocols, and what the trainer trades for memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

Algorithm = Literal["grpo", "ppo"]
"""`grpo`: the policy's forward/backward only (a reference forward when the KL term is on).
`ppo`: also a critic the size of the policy (a forward for values, then its own forward/backward)."""


@runtime_checkable
class GenerationCost(Protocol):
    """One generator replica (all the GPUs of its tensor-parallel group) of one model."""

    def decode_step_s(self, batch: int, context: int) -> float:
        """Seconds for one decode step of `batch` running sequences whose mean context
        (prompt + tokens so far) is `context` tokens: PTL(BS) at that context. A cost with a
        true `padded_attention` attribute (optional; an engine attending every sequence over
        the longest one's context) is given the batch's longest context instead."""
        ...

    def prefill_s(self, tokens: int) -> float:
        """Seconds of one engine step that admits prompts of `tokens` tokens in all (prefill and
        their first tokens; called only for a step that admits something)."""
        ...

    @property
    def max_batch(self) -> int:
        """The most sequences one replica runs at once (KV-cache memory or the engine's cap)."""
        ...


@runtime_checkable
class TrainingCost(Protocol):
    """The whole trainer stage (every rank) of one model and algorithm. A cost with a `memory`
    attribute (optional, a TrainerMemory) says which memory features it priced."""

    def train_s(self, tokens: int, micro_batches: int = 0) -> float:
        """Seconds of forward and backward (with the algorithm's reference/critic passes) over
        `tokens` trained (padded) tokens (prompt + output) in `micro_batches` micro-batches,
        spread over every rank; a cost with no per-micro-batch term ignores the count."""
        ...

    def step_s(self) -> float:
        """Seconds of the optimizer step that closes an iteration."""
        ...

    def publish_s(self) -> float:
        """Seconds to gather the full weights and hand them to the weight store (the transfer to
        generators is the scenario's link, not the trainer's)."""
        ...


@dataclass(frozen=True)
class LinearTrainingCost:
    """A TrainingCost linear in what it trains: seconds per padded token and per micro-batch,
    a fixed optimizer step and publish. A measured profile's (Profile.training_cost) and a
    scenario's table (trainer.cost.table) are both this."""

    s_per_token: float
    """Forward and backward seconds per padded token (prompt + output)."""
    optimizer_step_s: float
    publish_seconds: float
    micro_batch_s: float = 0.0
    """Fixed seconds per micro-batch (packing, the loss, Python)."""

    def train_s(self, tokens: int, micro_batches: int = 0) -> float:
        return tokens * self.s_per_token + micro_batches * self.micro_batch_s

    def step_s(self) -> float:
        return self.optimizer_step_s

    def publish_s(self) -> float:
        return self.publish_seconds


@dataclass(frozen=True)
class TrainerMemory:
    """What the trainer trades for memory (`spec.trainer.memory`), as the planner prices it."""

    activation_checkpointing: bool = False
    """Each decoder layer's input kept, its activations recomputed in the backward: one more
    forward of every trained model (policy, critic)."""
    cpu_offload: bool = False
    """FSDP2's CPUOffloadPolicy: sharded state in host memory, each layer's parameters copied in
    for its forward and backward, gradients copied out, the optimizer step on the host."""

    tensor_parallel: int = 1
    """Ranks each layer is split across (Megatron-style, within a node): each holds 1/t of a
    layer's weights and of the activations inside it, for two all-reduces of the layer's
    activations per pass."""

    def names(self) -> list[str]:
        return (["activation checkpointing"] if self.activation_checkpointing else []) + \
            (["CPU offload"] if self.cpu_offload else []) + \
            ([f"tensor parallel {self.tensor_parallel}"] if self.tensor_parallel > 1 else [])

    def covers(self, other: TrainerMemory) -> bool:
        """Whether every feature of `other` is on here too (its tensor-parallel size, if set, the same)."""
        return (self.activation_checkpointing or not other.activation_checkpointing) and \
            (self.cpu_offload or not other.cpu_offload) and \
            (other.tensor_parallel == 1 or self.tensor_parallel == other.tensor_parallel)


@runtime_checkable
class SwitchCost(Protocol):
    """Colocated mode's two switches per iteration, where generation and training take turns on
    the same GPUs."""

    def to_training_s(self) -> float:
        """Seconds from the last sample to the first micro-batch: the engine lets go of its KV
        cache (and its weights), the trainer's state comes back to the device."""
        ...

    def to_generation_s(self) -> float:
        """Seconds from the published version to the engine's first step: the trainer's state
        goes to host memory, the weights are resharded into the engine's layout, the KV cache
        is allocated again."""
        ...


def trained_models(algorithm: Algorithm) -> int:
    """Models with an optimizer: the policy, and PPO's critic."""
    return 2 if algorithm == "ppo" else 1


def forward_passes(algorithm: Algorithm, reference: bool, activation_checkpointing: bool = False) -> float:
    """Training FLOPs per token in units of one forward pass (2N): the policy's forward and
    backward are 3 (backward = 2 forwards, Kaplan et al. 2020's 6N), a reference forward 1, a
    critic's value forward and its own forward/backward 1 + 3; activation checkpointing
    recomputes each trained model's forward in its backward, 1 more each."""
    recompute = trained_models(algorithm) if activation_checkpointing else 0
    return 3.0 + (1.0 if reference else 0.0) + (4.0 if algorithm == "ppo" else 0.0) + recompute
