"""PPO's critic and its advantages: a value head on the policy's architecture, and the
generalised advantage estimate of every completion token from the sample's reward at its
last token. Knows tensors, nothing of ranks or groups."""

from __future__ import annotations

import copy
from typing import Any

import torch

from streamrl.logprobs import PackedBatch


class Critic(torch.nn.Module):
    """The policy's decoder stack (a copy: it starts from the policy's weights) and a linear
    value head, zero-initialised so that every value starts at 0. Its decoder layers are the
    units FSDP2 shards, as the policy's are."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        hf: Any = policy  # a Hugging Face causal LM (torch types a Module's attributes Tensor | Module)
        self.model = copy.deepcopy(hf.get_decoder())
        dtype = next(self.model.parameters()).dtype
        self.value_head = torch.nn.Linear(hf.config.hidden_size, 1, dtype=dtype)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)
        self.model.train()

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """[B, T-1] the value of the state before each target token (aligned with
        token_logprobs: position t values emitting token t+1), float32."""
        hidden = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        return self.value_head(hidden[:, :-1]).squeeze(-1).float()


def gae(values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each [B, T-1] and 0 where `mask` is: each sample's reward
    ([B]) comes at its last completion token, the value after that token is 0, and
    A_t = delta_t + gamma * lam * A_{t+1} with delta_t = r_t + gamma * V_{t+1} - V_t;
    returns = advantages + values. `values` carry no gradient."""
    mask = mask.to(values.dtype)
    length = mask.sum(-1).long()
    last = (mask.cumsum(-1) == length[:, None]) & mask.bool()
    token_rewards = last.to(values.dtype) * rewards[:, None]
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    for t in range(values.shape[1] - 1, -1, -1):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = (delta + gamma * lam * next_advantage) * mask[:, t]
        advantages[:, t] = advantage
        next_value = values[:, t] * mask[:, t]
        next_advantage = advantage
    return advantages, (advantages + values) * mask
