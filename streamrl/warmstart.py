"""Supervised warm start of the built-in tiny model on its task, so RL begins with signal.

Teacher-forced cross-entropy on answer tokens (+ EOS) for a fixed number of steps. Trains the
model it is given; where the model is loaded from and saved to is streamrl.models'.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from streamrl.spec import RLJobSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def warm_start(model: PreTrainedModel, tok: PreTrainedTokenizerBase, spec: RLJobSpec, batch_size: int = 32,
               lr: float = 1e-3, log=print) -> dict:
    """Train `model` in place (left in eval mode); returns the last loss and the seconds taken."""
    import torch

    from streamrl.logprobs import pack, token_logprobs
    from streamrl.tasks import load_prompts

    model.train()
    prompts = load_prompts(spec.task)
    rng = random.Random(spec.model.seed)
    torch.manual_seed(spec.model.seed)
    steps = spec.model.warm_start_steps
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    start = time.monotonic()
    loss_value = float("nan")
    for step in range(steps):
        batch = rng.sample(prompts, min(batch_size, len(prompts)))
        # the ignores: transformers types special-token ids loosely
        packed = pack([[tok.bos_token_id] + encode(p.text) for p in batch],  # pyright: ignore[reportArgumentType]
                      [encode(p.answer) + [tok.eos_token_id] for p in batch])  # pyright: ignore[reportArgumentType]
        logp = token_logprobs(model, packed)
        loss = -logp.sum() / packed.completion_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = loss.item()
        if (step + 1) % 100 == 0 or step + 1 == steps:
            log(f"  warm start step {step + 1}/{steps}  loss {loss_value:.3f}  {time.monotonic() - start:.0f}s")
    model.eval()
    return {"loss": loss_value, "seconds": time.monotonic() - start}
