"""What `streamrl profile` measures of the trainer: the real Learner's forward/backward seconds
per token at the job's micro-batch size, its optimizer step, and publishing (gathering the
weights and putting them in the weight store), on synthetic groups of fixed lengths. Knows the
learner, not the profile file."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from streamrl.samples import Group, Sample, ScoredSample
from streamrl.spec import AlgorithmSpec
from streamrl.trainer.learner import Learner
from streamrl.weights import WeightStore


@dataclass(frozen=True)
class TrainingMeasurement:
    micro_batch_size: int
    sequence_tokens: int
    """Prompt + completion tokens of every trained sample."""
    forward_backward_s_per_token: float
    optimizer_step_s: float
    publish_s: float


def synthetic_groups(num_samples: int, group_size: int, prompt_tokens: int, completion_tokens: int) -> list[Group]:
    """Scored groups of fixed lengths (ids 4..19, advantages +-1): what the learner trains on, minus meaning."""
    groups = []
    for g in range(-(-num_samples // group_size)):
        samples = tuple(
            ScoredSample(Sample(f"profile-{g}", i, tuple(4 + (i + k) % 16 for k in range(completion_tokens)),
                                (-1.0,) * completion_tokens, 0, "length"), 0.0, 1.0 if i % 2 else -1.0)
            for i in range(min(group_size, num_samples - g * group_size)))
        groups.append(Group(f"profile-{g}", 0, g, tuple(4 + k % 16 for k in range(prompt_tokens)), samples))
    return groups


def measure_training(model: torch.nn.Module, algo: AlgorithmSpec, device: str = "cpu", dtype: str = "float32",
                     prompt_tokens: int = 32, completion_tokens: int = 64, num_samples: int | None = None,
                     steps: int = 2, chunk_bytes: int = 1 << 20) -> TrainingMeasurement:
    """Train `steps` steps of `num_samples` samples (default two micro-batches) after a warm-up
    step; the learner's own StepStats give forward/backward and optimizer seconds."""
    learner = Learner(model, algo, device=device, dtype=dtype)
    num_samples = num_samples or 2 * algo.micro_batch_size
    groups = synthetic_groups(num_samples, algo.group_size, prompt_tokens, completion_tokens)
    store = WeightStore(keep=1, chunk_bytes=chunk_bytes)
    forward_backward_s = optimizer_s = publish_s = 0.0
    for step in range(steps + 1):
        learner.accumulate(groups, num_samples)
        stats = learner.step()
        t0 = time.perf_counter()
        store.publish(learner.policy_version, learner.weights())
        if step:  # the first step warms up
            forward_backward_s += stats.forward_backward_s
            optimizer_s += stats.optimizer_s
            publish_s += time.perf_counter() - t0
    tokens = num_samples * (prompt_tokens + completion_tokens)
    return TrainingMeasurement(algo.micro_batch_size, prompt_tokens + completion_tokens,
                               forward_backward_s / steps / tokens, optimizer_s / steps, publish_s / steps)
