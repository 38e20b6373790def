"""Per-token log-probabilities of completions under a causal LM (training-side forward).

Knows token ids and tensors only. Used by the learner (policy and reference) and the
supervised warm start.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedBatch:
    input_ids: torch.Tensor
    """[B, T] prompt + completion, right-padded with 0."""
    attention_mask: torch.Tensor
    """[B, T] 1 on real tokens."""
    completion_mask: torch.Tensor
    """[B, T-1] 1 where position t+1 is a completion token (the targets of logits[:, t])."""


def pack(prompts: list[list[int]], completions: list[list[int]], device: str | torch.device = "cpu") -> PackedBatch:
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    t = max(lengths)
    ids = torch.zeros(len(prompts), t, dtype=torch.long)
    attn = torch.zeros(len(prompts), t, dtype=torch.long)
    comp = torch.zeros(len(prompts), t, dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, : len(p) + len(c)] = torch.tensor(list(p) + list(c))
        attn[i, : len(p) + len(c)] = 1
        comp[i, len(p) : len(p) + len(c)] = True
    return PackedBatch(ids.to(device), attn.to(device), comp[:, 1:].to(device))


def token_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0) -> torch.Tensor:
    """[B, T-1] log p(token t+1 | tokens <= t) at the given temperature (0 where masked)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, 1:]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
    return logp * batch.completion_mask
