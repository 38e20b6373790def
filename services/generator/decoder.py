"""Forward pass of a Llama-family Hugging Face model over a slot KV cache.

Reuses the model's own modules (embeddings, norms, projections, rotary embedding, MLP),
so any LlamaForCausalLM / Qwen2 / Qwen3 / Mistral checkpoint runs unchanged; only the
attention cache is ours. Running sequences always occupy slots [0, num_running), so a
decode step reads the cache as a view, never as a gather. Knows nothing of scheduling.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


class SlotDecoder:
    def __init__(self, model: torch.nn.Module, num_slots: int, max_len: int):
        hf: Any = model  # read by its Hugging Face attribute names (torch types those Tensor | Module)
        cfg = hf.config
        inner = hf.model
        self.embed = inner.embed_tokens
        self.layers = list(inner.layers)
        self.norm = inner.norm
        self.rotary = inner.rotary_emb
        self.lm_head = hf.lm_head
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.max_len = max_len
        self.cache_shape = (len(self.layers), num_slots, self.num_kv_heads, max_len, self.head_dim)
        self.k = self.v = torch.empty(0)
        self.allocate()

    @property
    def cache_bytes(self) -> int:
        """Bytes of the allocated keys and values (0 while released)."""
        return self.k.nbytes + self.v.nbytes

    def allocate(self) -> None:
        """The cache, zeroed (after release(), or at construction)."""
        dtype, device = self.embed.weight.dtype, self.embed.weight.device
        self.k = torch.zeros(self.cache_shape, dtype=dtype, device=device)
        self.v = torch.zeros(self.cache_shape, dtype=dtype, device=device)

    def release(self) -> None:
        """Give the cache's memory back (every sequence in it is lost)."""
        self.k = self.v = torch.empty(0, dtype=self.k.dtype, device=self.k.device)

    @property
    def released(self) -> bool:
        return self.k.numel() == 0

    def _qkv(self, attn, x: torch.Tensor, positions: torch.Tensor):
        n, t, _ = x.shape
        q = attn.q_proj(x).view(n, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(n, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(n, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(attn, "q_norm"):  # Qwen3-style per-head norms
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = self.rotary(x, positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def _block(self, layer, h, attend) -> torch.Tensor:
        x = layer.input_layernorm(h)
        o = attend(layer.self_attn, x)
        h = h + layer.self_attn.o_proj(o)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    @torch.inference_mode()
    def prefill(self, first_slot: int, prompts: list[list[int]]) -> torch.Tensor:
        """Write the prompts' KV into slots first_slot.. (right-padded batch); return the
        [N, V] logits that follow each prompt's last token."""
        n = len(prompts)
        lengths = torch.tensor([len(p) for p in prompts], device=self.k.device)
        t = int(lengths.max())
        if t > self.max_len:
            raise ValueError(f"prompt of {t} tokens exceeds the engine's context of {self.max_len}")
        ids = torch.zeros(n, t, dtype=torch.long, device=self.k.device)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p)
        positions = torch.arange(t, device=ids.device).expand(n, t)
        key_ok = positions < lengths[:, None]  # [N, T]
        mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()[None] & key_ok[:, None, :]
        mask = mask[:, None]  # [N, 1, T, T]
        slots = slice(first_slot, first_slot + n)

        def attend(layer_idx):
            def run(attn, x):
                q, k, v = self._qkv(attn, x, positions)
                self.k[layer_idx, slots, :, :t] = k
                self.v[layer_idx, slots, :, :t] = v
                o = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=self.num_kv_heads != self.num_heads
                )
                return o.transpose(1, 2).reshape(n, t, -1)

            return run

        h = self.embed(ids)
        for i, layer in enumerate(self.layers):
            h = self._block(layer, h, attend(i))
        last = h[torch.arange(n), lengths - 1]
        return self.lm_head(self.norm(last)).float()

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token for each of slots [0, B): tokens [B] at positions [B]; return [B, V] logits."""
        b = tokens.shape[0]
        t_keys = int(positions.max()) + 1
        if t_keys > self.max_len:
            raise ValueError(f"sequence longer than the engine's context of {self.max_len}")
        pos = positions[:, None]  # [B, 1]
        mask = (torch.arange(t_keys, device=tokens.device)[None, :] <= pos)[:, None, None, :]  # [B,1,1,Tk]
        rows = torch.arange(b, device=tokens.device)

        def attend(layer_idx):
            def run(attn, x):
                q, k, v = self._qkv(attn, x, pos)
                self.k[layer_idx, rows, :, positions] = k[:, :, 0]
                self.v[layer_idx, rows, :, positions] = v[:, :, 0]
                keys = self.k[layer_idx, :b, :, :t_keys]
                values = self.v[layer_idx, :b, :, :t_keys]
                o = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=mask, scale=attn.scaling,
                    enable_gqa=self.num_kv_heads != self.num_heads,
                )
                return o.transpose(1, 2).reshape(b, 1, -1)

            return run

        h = self.embed(tokens[:, None])
        for i, layer in enumerate(self.layers):
            h = self._block(layer, h, attend(i))
        return self.lm_head(self.norm(h[:, 0])).float()

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy a sequence's cache from slot src to slot dst (compaction after a finish)."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]
