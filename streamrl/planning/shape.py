"""A model's shape as the cost model needs it (layers, widths, heads, vocabulary) and what
follows from it: parameters, FLOPs per token, KV-cache bytes per token. Read from a Hugging
Face `config.json` or given as numbers. Dense decoder-only transformers (Llama/Qwen/Mistral
style: GQA attention, gated MLP); mixture-of-experts is not modelled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelShape(BaseModel):
    """A dense decoder-only transformer, by its dimensions."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    name: str = "model"
    """What to call it in tables and errors."""
    num_layers: int = Field(ge=1)
    """Transformer blocks (`num_hidden_layers`)."""
    hidden_size: int = Field(ge=1)
    """Residual width (`hidden_size`)."""
    num_heads: int = Field(ge=1)
    """Query heads (`num_attention_heads`)."""
    num_kv_heads: int = Field(ge=1)
    """Key/value heads (`num_key_value_heads`; = num_heads without grouped-query attention)."""
    vocab_size: int = Field(ge=1)
    """Vocabulary (`vocab_size`)."""
    intermediate_size: int = Field(ge=1)
    """Gated MLP width (`intermediate_size`): three matrices of hidden x intermediate per block."""
    head_dim: int | None = Field(default=None, ge=1)
    """Width of one head (default hidden_size / num_heads)."""
    tie_word_embeddings: bool = False
    """The output projection shares the input embedding's matrix."""
    source: str = ""
    """Where the numbers come from (a config.json's path or address)."""

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelShape:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        return self

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def layer_params(self) -> int:
        """Parameters of one block: Q, K, V, O projections, the gated MLP and two norms (biases ignored)."""
        h, d = self.hidden_size, self.dim_per_head
        attention = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2
        return attention + 3 * h * self.intermediate_size + 2 * h

    @property
    def embedding_params(self) -> int:
        """Input embedding, plus the output projection unless tied."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def num_params(self) -> int:
        return self.num_layers * self.layer_params + self.embedding_params + self.hidden_size

    @property
    def matmul_params(self) -> int:
        """Parameters a token multiplies through (the embedding lookup is not a matmul; the
        output projection is): the N of 2N FLOPs per token."""
        return self.num_layers * self.layer_params + self.vocab_size * self.hidden_size

    def attention_flops_per_token(self, context: float) -> float:
        """FLOPs of one token's forward attention over `context` earlier tokens: QK^T and AV,
        2 x 2 x heads x head_dim per attended token per layer (what flash attention computes)."""
        return 4 * self.num_layers * self.num_heads * self.dim_per_head * context

    def forward_flops_per_token(self, context: float) -> float:
        """FLOPs of one token's forward pass attending to `context` earlier tokens: 2 per
        matmul parameter, plus the attention's."""
        return 2 * self.matmul_params + self.attention_flops_per_token(context)

    def kv_values_per_token(self) -> int:
        """Keys and values one token leaves in the cache, over all layers (multiply by bytes per value)."""
        return 2 * self.num_layers * self.num_kv_heads * self.dim_per_head

    def describe(self) -> str:
        return f"{self.name} ({self.num_params / 1e9:.2f} B parameters)"

    @classmethod
    def from_hf_config(cls, config: dict | str | Path, name: str | None = None) -> ModelShape:
        """From a Hugging Face `config.json` (a path to it or to its directory, or the decoded
        dict); ValueError naming the missing key."""
        source = "config"
        if not isinstance(config, dict):
            path = Path(config)
            path = path / "config.json" if path.is_dir() else path
            try:
                config = cast(dict, json.loads(path.read_text()))
            except (OSError, ValueError) as err:
                raise ValueError(f"model config {path}: cannot read: {err}") from None
            source = str(path)
            name = name or path.parent.name
        config = cast(dict, config.get("text_config", config))  # multimodal wrappers keep the LM's here
        keys = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size",
                "num_heads": "num_attention_heads", "vocab_size": "vocab_size",
                "intermediate_size": "intermediate_size"}
        missing = [hf for hf in keys.values() if hf not in config]
        if missing:
            raise ValueError(f"model config {source}: missing {', '.join(missing)} (a dense decoder-only "
                             "transformer's config.json has them)")
        values = {ours: config[hf] for ours, hf in keys.items()}
        values["num_kv_heads"] = config.get("num_key_value_heads") or config["num_attention_heads"]
        if config.get("head_dim"):
            values["head_dim"] = config["head_dim"]
        values["tie_word_embeddings"] = bool(config.get("tie_word_embeddings", False))
        return cls(name=name or config.get("_name_or_path") or "model", source=source, **values)
