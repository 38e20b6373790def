"""The RL learner: PPO-clip policy loss on scored groups, optional KL to the initial
policy, AdamW; under `ppo`, a critic valued and trained beside the policy, each token's
advantage its GAE. Accumulates gradients over micro-batches; one optimizer step per batch.
Knows tensors and groups, nothing of gRPC or dispatch."""

from __future__ import annotations

import copy
import math
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from streamrl.logprobs import pack, token_logprobs
from streamrl.metrics import (
    ALL_REDUCE,
    GATHER_WEIGHTS,
    OPTIMIZER_STEP,
    SCATTER,
    WAITING_LEADER,
    ServiceMetrics,
    StageClock,
)
from streamrl.records import StepStats
from streamrl.samples import Group, Sample, ScoredSample, micro_batches_by_length
from streamrl.spec import AlgorithmSpec, TrainerMemorySpec
from streamrl.trainer.commands import Accumulate, CommandT, Gather, Load, Save, Step, Stop
from streamrl.trainer.critic import Critic, gae
from streamrl.trainer.ranks import (
    Ranks,
    balance_by_tokens,
    checkpoint_activations,
    clip_grad_norm,
    full_state_dict,
    shard,
)
from streamrl.trainer.timings import RankTimings


@dataclass(frozen=True)
class Mismatch:
    """Sums over completion tokens of how the learner's log-probability of each sampled token
    (log p) differs from the engine's (log q), before this step: the train/inference mismatch."""

    tokens: int = 0
    abs_logp: float = 0.0
    """Sum of |log p - log q|."""
    kl: float = 0.0
    """Sum of the k3 estimate of KL(engine || learner) on the engine's samples: r - 1 - log r, r = p / q."""
    ratio_max: float = 1.0
    """The largest probability ratio of one token either way, max(p / q, q / p)."""
    capped: int = 0
    """Tokens whose importance weight was truncated or masked at the cap (0 without a correction)."""


def importance_weights(delta: torch.Tensor, mask: torch.Tensor, mode: str,
                       cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weights ([B, T]) of the correction `mode` for log-ratios `delta` = log p - log q
    ([B, T], zero off the mask), and which tokens were capped. Truncation is a min with `cap`; a
    masked sample (its product of ratios above `cap`) weighs 0. In log space: no overflow."""
    log_cap = math.log(cap)
    log_w = delta if mode == "token-truncate" else (delta * mask).sum(-1, keepdim=True).expand_as(delta)
    over = (log_w > log_cap) & mask.bool()
    weights = torch.exp(log_w.clamp(max=log_cap))
    if mode == "sequence-mask":
        weights = weights.masked_fill(over, 0.0)
    elif mode not in ("token-truncate", "sequence-truncate"):
        raise ValueError(f"algorithm.importanceSampling.mode: unknown {mode!r}")
    return weights * mask, over


@dataclass(frozen=True)
class LossTerms:
    loss: torch.Tensor
    """Scalar: mean over samples of the per-sample token-mean loss (scaled by `weight`)."""
    clip_fraction: float
    """Fraction of completion tokens whose ratio was clipped."""
    kl: float
    """Mean k3 KL estimate per token (0 without a reference)."""
    mismatch: Mismatch = Mismatch()


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
    importance_sampling: str = "none",
    cap: float = 3.0,
) -> LossTerms:
    """PPO-clip objective summed over samples times `weight`; each sample contributes its
    token-mean loss, or its token-sum / token_normalizer when that is given.

    logp, behaviour_logp, ref_logp, mask: [B, T]; advantages: [B] (one per sample) or [B, T]
    (one per token). `importance_sampling` "none": the ratio is exp(logp - behaviour_logp),
    clipped to [1 - clip_eps, 1 + clip_eps_high]. Otherwise the ratio is against the
    learner's own log-probabilities before this step (logp, detached) and each token's loss is
    weighted by importance_weights(...) of the learner/engine ratio (spec ImportanceSamplingSpec).
    The mismatch between logp and behaviour_logp is measured either way.
    """
    mask = mask.to(logp.dtype)
    with torch.no_grad():
        delta = (logp.detach() - behaviour_logp) * mask
        on = mask.bool()
        mismatch = Mismatch(
            tokens=int(mask.sum()), abs_logp=float(delta.abs().sum()),
            kl=float(((torch.exp(delta.clamp(max=50.0)) - 1 - delta) * mask).sum()),
            ratio_max=float(torch.exp(delta.abs()[on].max().clamp(max=50.0))) if on.any() else 1.0)
    if importance_sampling == "none":
        ratio = torch.exp(logp - behaviour_logp)
        is_weights = None
    else:
        ratio = torch.exp(logp - logp.detach())
        is_weights, capped = importance_weights(delta, mask, importance_sampling, cap)
        mismatch = replace(mismatch, capped=int(capped.sum()))
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights
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
        mismatch,
    )


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, weight: float = 1.0,
               token_normalizer: float | None = None) -> torch.Tensor:
    """The critic's loss: half the squared error to the returns, aggregated over tokens and
    samples as the policy's loss is (values, returns, mask: [B, T])."""
    mask = mask.to(values.dtype)
    per_token = 0.5 * (values - returns) ** 2
    denom = mask.sum(-1).clamp(min=1) if token_normalizer is None else token_normalizer
    return ((per_token * mask).sum(-1) / denom).sum() * weight


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
    value_loss: float = 0.0
    forward_backward_s: float = 0.0
    mismatch_tokens: int = 0
    mismatch_abs_logp: float = 0.0
    mismatch_kl: float = 0.0
    mismatch_ratio_max: float = 1.0
    mismatch_capped: int = 0


class Learner:
    """The learner of one rank. Rank 0 leads: accumulate() splits the samples over the ranks
    by tokens and hands each rank its share (everyone runs the same number of micro-batches,
    a short share padded with zero-weight ones, so the sharded model's collectives line up);
    step() and weights() are commands every rank runs. The other ranks run follow() until
    the leader stops them. At world size 1 a command is a local call."""

    def __init__(self, model: torch.nn.Module, algo: AlgorithmSpec, device: str = "cpu", ranks: Ranks | None = None,
                 dtype: str = "float32", metrics: ServiceMetrics | None = None,
                 memory: TrainerMemorySpec | None = None):
        self.ranks = ranks or Ranks()
        self.timings = RankTimings(metrics, self.ranks)
        """This rank's forward/backward and collective seconds, onto `metrics` (None: not measured)."""
        self.algo = algo
        self.device = device
        memory = memory or TrainerMemorySpec()
        model = model.to(device).train()
        reference = copy.deepcopy(model).eval().requires_grad_(False) if algo.kl_coef > 0 else None
        critic = Critic(model) if algo.type == "ppo" else None  # from the policy's weights, before sharding
        if memory.activation_checkpointing:
            for module in (model, critic and critic.model):
                if module is not None:
                    checkpoint_activations(module)  # the reference runs without gradients: nothing to recompute
        self.tensor_parallel = memory.tensor_parallel
        """Ranks that split each layer and take the same samples (consecutive ranks)."""
        self.data_parallel = self.ranks.world_size // self.tensor_parallel
        """Groups of ranks the samples are shared among."""

        def sharded(module: torch.nn.Module) -> torch.nn.Module:
            return shard(module, self.ranks, dtype, memory.cpu_offload, memory.tensor_parallel)

        self.model = sharded(model)
        self.ref_model = sharded(reference) if reference is not None else None
        self.critic = sharded(critic) if critic is not None else None
        for module in (self.model, self.ref_model, self.critic):
            self.timings.watch_all_gathers(module)
        self.optimizer, self.scheduler = _adamw(self.model, algo.learning_rate, algo)
        self.critic_optimizer = self.critic_scheduler = None
        if self.critic is not None:
            self.critic_optimizer, self.critic_scheduler = _adamw(
                self.critic, algo.critic_learning_rate or algo.learning_rate, algo)
        self.policy_version = 0
        self._acc = _Accumulated()
        self._saving: Future | None = None
        """This rank's checkpoint save still being written (one at a time)."""

    # ---- the leader's side ------------------------------------------------------------
    def accumulate(self, groups: list[Group], num_samples_in_step: int) -> None:
        """Forward/backward on these groups over every rank; gradients accumulate until step()."""
        samples = [(g.prompt_token_ids, s) for g in groups for s in g.samples]
        tokens = [len(p) + len(s.sample.completion_token_ids) for p, s in samples]
        shares = balance_by_tokens(samples, tokens, self.data_parallel)
        num_micro_batches = max(math.ceil(len(share) / self.algo.micro_batch_size) for share in shares)
        mine = self._send([Accumulate(shares[r // self.tensor_parallel], num_samples_in_step, num_micro_batches)
                           for r in range(self.ranks.world_size)])  # a layer's ranks take the same samples
        self._accumulate(mine.share, mine.num_samples_in_step, mine.num_micro_batches)

    def step(self) -> StepStats:
        """Clip gradients, take the optimizer step on every rank, bump policy_version."""
        self._send([Step()] * self.ranks.world_size)
        return self._step()

    def weights(self) -> dict[str, torch.Tensor]:
        """The parameters to publish, by name (tied weights once), gathered whole to this rank."""
        self._send([Gather()] * self.ranks.world_size)
        return self._gather()

    def save(self, path: Path) -> Future | None:
        """Start a checkpoint of every rank's shard into `path` (a collective): the state is
        copied off the model before this returns, then written in the background; the
        returned future (rank 0's) completes once every rank's part is on disk. A save still
        being written is waited for first."""
        self._send([Save(str(path))] * self.ranks.world_size)
        return self._save(Path(path))

    def load(self, path: Path) -> None:
        """Every rank takes its shard of the model and optimizer, its LR schedule, RNG state and
        the policy version from the checkpoint in `path` (written by any world size)."""
        self._send([Load(str(path))] * self.ranks.world_size)
        self._load(Path(path))

    def stop(self) -> None:
        """Let the other ranks leave follow()."""
        self._send([Stop()] * self.ranks.world_size)

    def _send(self, per_rank: list[CommandT]) -> CommandT:
        with self.timings.collective(SCATTER):
            return self.ranks.send(per_rank)

    # ---- every other rank -------------------------------------------------------------
    def follow(self, clock: StageClock | None = None) -> None:
        """Run the leader's commands until it says stop (busy while running one, on `clock`)."""
        while True:
            if clock is not None:
                clock.idle(WAITING_LEADER)
            command = self.ranks.receive()
            if clock is not None:
                clock.busy()
            match command:
                case Accumulate(share, num_samples_in_step, num_micro_batches):
                    self._accumulate(share, num_samples_in_step, num_micro_batches)
                case Step():
                    self._step()
                case Gather():
                    self._gather()
                case Save(path):
                    self._save(Path(path))
                case Load(path):
                    self._load(Path(path))
                case Stop():
                    self.wait_saved()  # its part of a checkpoint is on disk before it leaves
                    return
                case _:
                    raise ValueError(f"unknown command from rank 0: {command!r}")

    # ---- every rank -------------------------------------------------------------------
    def _accumulate(self, samples, num_samples_in_step: int, num_micro_batches: int) -> None:
        """This rank's share, in micro-batches; samples are ordered by length first (output
        lengths are long-tailed: one long sample would otherwise pad a whole micro-batch).
        The loss is a fixed-weight sum over samples, so the grouping does not change the
        gradient; with several data-parallel groups of ranks, whose gradients FSDP averages, each
        weighs in by their number."""
        batches = micro_batches_by_length(samples, lambda item: len(item[0]) + len(item[1].sample.completion_token_ids),
                                          self.algo.micro_batch_size)
        weight = self.data_parallel / num_samples_in_step
        for k in range(num_micro_batches):
            if k < len(batches):
                self._micro_batch(batches[k], weight)
            else:  # the same collectives as the others, contributing nothing
                self._micro_batch([_PADDING], 0.0)

    def _micro_batch(self, items, weight: float) -> None:
        t0 = time.monotonic()
        prompts = [list(p) for p, _ in items]
        completions = [list(s.sample.completion_token_ids) for _, s in items]
        batch = pack(prompts, completions, self.device)
        behaviour = torch.zeros_like(batch.completion_mask, dtype=torch.float32)
        for i, (p, s) in enumerate(items):
            behaviour[i, len(p) - 1 : len(p) - 1 + len(s.sample.logprobs)] = torch.tensor(s.sample.logprobs)
        normalizer = self.algo.max_new_tokens if self.algo.loss_aggregation == "token-sum" else None
        critic_loss = None
        if self.critic is None:
            advantages = torch.tensor([s.advantage for _, s in items], dtype=torch.float32, device=self.device)
        else:  # each token's GAE from the critic's values; the critic learns the returns
            values = self.critic(batch)
            rewards = torch.tensor([s.reward for _, s in items], dtype=torch.float32, device=self.device)
            with torch.no_grad():
                advantages, returns = gae(values.detach(), rewards, batch.completion_mask, self.algo.gamma,
                                          self.algo.gae_lambda)
            critic_loss = value_loss(values, returns, batch.completion_mask, weight, normalizer)
        logp = token_logprobs(self.model, batch, self.algo.temperature)
        ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref = token_logprobs(self.ref_model, batch, self.algo.temperature)
        correction = self.algo.importance_sampling
        terms = ppo_clip_loss(logp, behaviour, advantages, batch.completion_mask, self.algo.clip_eps,
                              self.algo.clip_eps_high, ref, self.algo.kl_coef, weight, normalizer,
                              correction.mode, correction.cap)
        (terms.loss if critic_loss is None else terms.loss + critic_loss).backward()
        self.timings.forward_backward(time.monotonic() - t0)
        if weight == 0.0:
            return  # padding: nothing to count
        n = len(items)
        acc = self._acc
        acc.num_samples += n
        acc.num_micro_batches += 1
        acc.loss += terms.loss.item() / self.data_parallel
        acc.clipped += terms.clip_fraction * n
        acc.kl += terms.kl * n
        acc.value_loss += critic_loss.item() / self.data_parallel if critic_loss is not None else 0.0
        acc.forward_backward_s += time.monotonic() - t0
        mm = terms.mismatch
        acc.mismatch_tokens += mm.tokens
        acc.mismatch_abs_logp += mm.abs_logp
        acc.mismatch_kl += mm.kl
        acc.mismatch_ratio_max = max(acc.mismatch_ratio_max, mm.ratio_max)
        acc.mismatch_capped += mm.capped

    def _step(self) -> StepStats:
        t0 = time.monotonic()
        with self.timings.collective(OPTIMIZER_STEP):
            grad_norm = clip_grad_norm(self.model.parameters(), self.algo.max_grad_norm)  # over every shard
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.critic is not None:
                assert self.critic_optimizer is not None and self.critic_scheduler is not None  # made with it
                clip_grad_norm(self.critic.parameters(), self.algo.max_grad_norm)
                self.critic_optimizer.step()
                self.critic_scheduler.step()
                self.critic_optimizer.zero_grad(set_to_none=True)
        self.policy_version += 1
        acc, self._acc = self._acc, _Accumulated()
        with self.timings.collective(ALL_REDUCE):
            summed = self.ranks.sum([acc.num_samples, acc.num_micro_batches, acc.loss, acc.clipped, acc.kl,
                                     acc.value_loss, acc.mismatch_tokens, acc.mismatch_abs_logp, acc.mismatch_kl,
                                     acc.mismatch_capped])
            # every rank of a tensor-parallel group counted the same samples: once per group
            (num_samples, num_micro_batches, loss, clipped, kl, critic_loss, tokens, abs_logp, mismatch_kl,
             capped) = (x / self.tensor_parallel for x in summed)
            forward_backward_s = self.ranks.maximum(acc.forward_backward_s)
            ratio_max = self.ranks.maximum(acc.mismatch_ratio_max)
        n, t = max(num_samples, 1), max(tokens, 1)
        return StepStats(int(num_samples), int(num_micro_batches), loss, clipped / n, kl / n, float(grad_norm),
                         forward_backward_s, time.monotonic() - t0, critic_loss,
                         mismatch_abs_logp=abs_logp / t, mismatch_kl=mismatch_kl / t, mismatch_ratio_max=ratio_max,
                         importance_capped_fraction=capped / t)

    def wait_saved(self) -> float:
        """Wait for this rank's checkpoint save to be on disk; the seconds waited."""
        t0 = time.monotonic()
        if self._saving is not None:
            self._saving.result()
            self._saving = None
        return time.monotonic() - t0

    def _save(self, path: Path) -> Future:
        from torch.distributed.checkpoint.state_dict_saver import async_save  # = dcp.async_save

        self.wait_saved()
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"policy_version": self.policy_version, "scheduler": self.scheduler.state_dict(),
                    "critic_scheduler": self.critic_scheduler.state_dict() if self.critic_scheduler else None,
                    "rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state() if str(self.device).startswith("cuda") else None},
                   path / rank_file(self.ranks.rank))
        saving = async_save(self._state(), checkpoint_id=str(path), process_group=self.ranks.checkpoints,
                            no_dist=self.ranks.world_size == 1)
        assert isinstance(saving, Future)  # an AsyncSaveResponse comes only with an async_stager
        self._saving = saving
        return saving

    def _state(self) -> dict:
        """The sharded state a checkpoint holds: the policy and its optimizer, and under ppo the
        critic and its optimizer."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        state = {"model": model, "optimizer": optimizer}
        if self.critic is not None:
            assert self.critic_optimizer is not None  # made with the critic
            state["critic"], state["critic_optimizer"] = get_state_dict(self.critic, self.critic_optimizer)
        return state

    def _load(self, path: Path) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load  # = dcp.load

        state = self._state()
        load(state, checkpoint_id=str(path), process_group=self.ranks.checkpoints, no_dist=self.ranks.world_size == 1)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        if self.critic is not None:
            assert self.critic_optimizer is not None  # made with the critic
            set_state_dict(self.critic, self.critic_optimizer, model_state_dict=state["critic"],
                           optim_state_dict=state["critic_optimizer"])
        own = path / rank_file(self.ranks.rank)
        extra = torch.load(own if own.exists() else path / rank_file(0), weights_only=False)
        self.policy_version = extra["policy_version"]
        self.scheduler.load_state_dict(extra["scheduler"])
        if self.critic_scheduler is not None:
            self.critic_scheduler.load_state_dict(extra["critic_scheduler"])
        torch.set_rng_state(extra["rng"])
        if extra.get("cuda_rng") is not None and str(self.device).startswith("cuda"):
            torch.cuda.set_rng_state(extra["cuda_rng"])

    def _gather(self) -> dict[str, torch.Tensor]:
        with self.timings.collective(GATHER_WEIGHTS):
            return full_state_dict(self.model, self.ranks)


def _adamw(module: torch.nn.Module, learning_rate: float, algo: AlgorithmSpec):
    """AdamW over the module's parameters and its linear warm-up schedule."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=learning_rate, weight_decay=algo.weight_decay)
    warmup = algo.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
    return optimizer, scheduler


def rank_file(rank: int) -> str:
    """A rank's own part of a checkpoint beside the sharded tensors: LR schedule, RNG state,
    policy version (a rank of a larger world than the checkpoint's takes rank 0's)."""
    return f"rank-{rank}.pt"


_PADDING = ((0,), ScoredSample(Sample("padding", 0, (0,), (0.0,), 0, "stop"), 0.0, 0.0))
"""A one-token sample for a rank whose share ran out of micro-batches."""
