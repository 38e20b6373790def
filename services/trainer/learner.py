"""The RL learner: PPO-clip policy loss on scored groups, optional KL to the initial
policy, AdamW. Accumulates gradients over micro-batches; one optimizer step per batch.
Knows tensors and groups, nothing of gRPC or dispatch."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from streamrl.logprobs import pack, token_logprobs
from streamrl.records import StepStats
from streamrl.samples import Group
from streamrl.spec import AlgorithmSpec


@dataclass(frozen=True)
class LossTerms:
    loss: torch.Tensor
    """Scalar: mean over samples of the per-sample token-mean loss (scaled by `weight`)."""
    clip_fraction: float
    """Fraction of completion tokens whose ratio was clipped."""
    kl: float
    """Mean k3 KL estimate per token (0 without a reference)."""


def ppo_clip_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    clip_eps_high: float,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    weight: float = 1.0,
    token_normalizer: float | None = None,
) -> LossTerms:
    """PPO-clip objective summed over samples times `weight`; each sample contributes its
    token-mean loss, or its token-sum / token_normalizer when that is given.

    logp, behaviour_logp, ref_logp, mask: [B, T]; advantages: [B]. The importance ratio
    is exp(logp - behaviour_logp), clipped to [1 - clip_eps, 1 + clip_eps_high].
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - behaviour_logp)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl_value = 0.0
    if ref_logp is not None and kl_coef > 0:
        log_r = ref_logp - logp
        kl = torch.exp(log_r) - log_r - 1  # k3 estimator, >= 0
        per_token = per_token + kl_coef * kl
        kl_value = float((kl * mask).sum() / mask.sum().clamp(min=1))
    denom = mask.sum(-1).clamp(min=1) if token_normalizer is None else token_normalizer
    per_sample = (per_token * mask).sum(-1) / denom
    was_clipped = (unclipped != clipped) & mask.bool()
    return LossTerms(
        per_sample.sum() * weight,
        float(was_clipped.sum() / mask.sum().clamp(min=1)),
        kl_value,
    )


@dataclass
class _Accumulated:
    """Sums over the micro-batches since the last optimizer step."""

    num_samples: int = 0
    num_micro_batches: int = 0
    loss: float = 0.0
    clipped: float = 0.0
    """Clip fraction x samples."""
    kl: float = 0.0
    """KL x samples."""
    forward_backward_s: float = 0.0


class Learner:
    def __init__(self, model: torch.nn.Module, algo: AlgorithmSpec, device: str = "cpu"):
        self.model = model.to(device).train()
        self.algo = algo
        self.device = device
        self.ref_model = None
        if algo.kl_coef > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=algo.learning_rate, weight_decay=algo.weight_decay
        )
        warmup = algo.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self.policy_version = 0
        self._acc = _Accumulated()

    def accumulate(self, groups: list[Group], num_samples_in_step: int) -> None:
        """Forward/backward on these groups, in micro-batches; gradients accumulate until step().

        Samples are ordered by length before they are cut into micro-batches: output
        lengths are long-tailed, and one long sample would otherwise pad a whole
        micro-batch to its length. The loss is a fixed-weight sum over samples, so the
        grouping does not change the gradient."""
        samples = sorted(((g.prompt_token_ids, s) for g in groups for s in g.samples),
                         key=lambda item: len(item[0]) + len(item[1].sample.completion_token_ids))
        mb = self.algo.micro_batch_size
        for start in range(0, len(samples), mb):
            self._micro_batch(samples[start : start + mb], num_samples_in_step)

    def _micro_batch(self, items, num_samples_in_step: int) -> None:
        t0 = time.monotonic()
        prompts = [list(p) for p, _ in items]
        completions = [list(s.sample.completion_token_ids) for _, s in items]
        batch = pack(prompts, completions, self.device)
        behaviour = torch.zeros_like(batch.completion_mask, dtype=torch.float32)
        for i, (p, s) in enumerate(items):
            behaviour[i, len(p) - 1 : len(p) - 1 + len(s.sample.logprobs)] = torch.tensor(s.sample.logprobs)
        advantages = torch.tensor([s.advantage for _, s in items], dtype=torch.float32, device=self.device)
        logp = token_logprobs(self.model, batch, self.algo.temperature)
        ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref = token_logprobs(self.ref_model, batch, self.algo.temperature)
        terms = ppo_clip_loss(logp, behaviour, advantages, batch.completion_mask, self.algo.clip_eps,
                              self.algo.clip_eps_high, ref, self.algo.kl_coef, 1.0 / num_samples_in_step,
                              self.algo.max_new_tokens if self.algo.loss_aggregation == "token-sum" else None)
        terms.loss.backward()
        n = len(items)
        acc = self._acc
        acc.num_samples += n
        acc.num_micro_batches += 1
        acc.loss += terms.loss.item()
        acc.clipped += terms.clip_fraction * n
        acc.kl += terms.kl * n
        acc.forward_backward_s += time.monotonic() - t0

    def step(self) -> StepStats:
        """Clip gradients, take the optimizer step, bump policy_version; return the step's stats."""
        t0 = time.monotonic()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.algo.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.policy_version += 1
        acc, self._acc = self._acc, _Accumulated()
        n = max(acc.num_samples, 1)
        return StepStats(acc.num_samples, acc.num_micro_batches, acc.loss, acc.clipped / n, acc.kl / n,
                         float(grad_norm), acc.forward_backward_s, time.monotonic() - t0)

    def weights(self) -> dict[str, torch.Tensor]:
        """The parameters to publish, by name (tied weights once)."""
        return {k: v.detach() for k, v in self.model.named_parameters()}
