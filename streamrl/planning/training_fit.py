"""Training efficiency from published measurements: a trainer's seconds per token are its
matmul FLOPs at one fraction of the GPU's peak plus its attention FLOPs at another (flash
attention's kernels reach less of the peak than large GEMMs, and their share grows with the
sequence: llm-foundry's MPT-7B runs at 0.68 of an A100's peak at 4K tokens and 0.47 at 32K).
The two fractions of each GPU type are fitted to the `use: fit` rows of
deploy/catalog/training.yaml on that type; the catalog hands them to every GPU type it loads
(load_catalog), so the roofline prices training with them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from streamrl.planning.costs import forward_passes
from streamrl.planning.shape import ModelShape


class PublishedTrainingRun(BaseModel):
    """One published training throughput: `gpus` GPUs training `model` on sequences of
    `sequence_tokens` tokens (pretraining: the policy's forward and backward, no reference)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    name: str
    framework: str
    """The framework and its sharding as the source states them (`torchtitan (FSDP2)`)."""
    gpu: str
    """A GPU type of the catalog."""
    gpus: int = Field(ge=1)
    tp: int = Field(default=1, ge=1, le=64)
    """Tensor-parallel size (within a node); the rest of the GPUs shard data (FSDP)."""
    model: str
    """A model shape of the catalog."""
    sequence_tokens: int = Field(ge=1)
    activation_checkpointing: Literal["full", "selective", "none"]
    """`full`: every layer's forward recomputed in its backward (one more forward of FLOPs);
    `selective` recomputes what the source chose (elementwise ops, or some layers) and is
    priced as `none`: the roofline has no such option."""
    tokens_per_s_per_gpu: float = Field(gt=0)
    derived: str = ""
    """How `tokens_per_s_per_gpu` follows from the published figure, where it is not one itself."""
    note: str = ""
    use: Literal["fit", "check"]
    """`fit`: the efficiencies are fitted to it; `check`: only compared with (held out)."""
    source: str
    quote: str
    """The published figure as its source prints it."""


@dataclass(frozen=True)
class TrainingEfficiency:
    """Fractions of a GPU's peak BF16 FLOP/s that training's matmuls and its attention reach."""

    matmul: float
    attention: float
    note: str
    """Where the two come from (fitted to which rows, or borrowed from which GPU type)."""


def training_flops(shape: ModelShape, sequence_tokens: float, passes: float) -> tuple[float, float]:
    """(matmul, attention) FLOPs per trained token of a sequence of `sequence_tokens` over
    `passes` forwards (costs.forward_passes): every matmul, and a causal attention over half the
    sequence on average."""
    return passes * 2 * shape.matmul_params, passes * shape.attention_flops_per_token(sequence_tokens / 2)


def pretraining_flops(shape: ModelShape, sequence_tokens: float, full_checkpointing: bool) -> tuple[float, float]:
    """training_flops of a published run: the forward and backward (and a recompute with full
    checkpointing) of one model."""
    passes = forward_passes("grpo", reference=False, activation_checkpointing=full_checkpointing)
    return training_flops(shape, sequence_tokens, passes)


def fit_efficiency(points: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """(matmul, attention) efficiencies from (matmul FLOP/s, attention FLOP/s, peak FLOP/s)
    triples, each a measurement's FLOPs per token times its measured tokens/s: least squares
    on the relative error of the predicted seconds per token. Where the two are not told apart
    (no spread in sequence length) or the fit leaves (0, 1], one efficiency for both."""
    if not points:
        raise ValueError("no training measurements to fit")
    rows = [(m / peak, a / peak) for m, a, peak in points]  # predicted time / measured time = x*u + y*v
    suu = sum(u * u for u, _ in rows)
    svv = sum(v * v for _, v in rows)
    suv = sum(u * v for u, v in rows)
    su, sv = sum(u for u, _ in rows), sum(v for _, v in rows)
    det = suu * svv - suv * suv
    if det > 1e-12 * suu * svv:
        x = (su * svv - sv * suv) / det  # x = 1 / matmul efficiency, y = 1 / attention efficiency
        y = (sv * suu - su * suv) / det
        if x >= 1 and y >= 1:
            return 1 / x, 1 / y
    both = sum(u + v for u, v in rows) / sum((u + v) ** 2 for u, v in rows)
    return min(1.0, both), min(1.0, both)


def training_efficiencies(rows: Sequence[PublishedTrainingRun], shapes: dict[str, ModelShape],
                          peaks: dict[str, float]) -> tuple[dict[str, TrainingEfficiency], TrainingEfficiency | None]:
    """The fitted efficiencies of each GPU type with `use: fit` rows ({lower-case name: ...}),
    and one pooled over every fit row (for the types without rows). `shapes` and `peaks` (FLOP/s)
    are by lower-case name; a row naming an unknown model or GPU type is a ValueError."""
    by_gpu: dict[str, list[tuple[float, float, float]]] = {}
    names: dict[str, str] = {}
    for row in rows:
        if row.use != "fit":
            continue
        shape, peak = shapes.get(row.model.lower()), peaks.get(row.gpu.lower())
        if shape is None or peak is None:
            what = f"model {row.model!r}" if shape is None else f"gpu {row.gpu!r}"
            raise ValueError(f"training measurement {row.name}: {what} is not in the catalog")
        if row.tp != 1:
            raise ValueError(f"training measurement {row.name}: a fit row must be tensor-parallel 1 (tp {row.tp}); "
                             "make it `use: check`")
        matmul, attention = pretraining_flops(shape, row.sequence_tokens, row.activation_checkpointing == "full")
        names.setdefault(row.gpu.lower(), row.gpu)
        by_gpu.setdefault(row.gpu.lower(), []).append(
            (matmul * row.tokens_per_s_per_gpu, attention * row.tokens_per_s_per_gpu, peak))
    fitted = {}
    for gpu, points in by_gpu.items():
        m, a = fit_efficiency(points)
        fitted[gpu] = TrainingEfficiency(m, a, f"fitted to {len(points)} published runs on {names[gpu]} "
                                               "(deploy/catalog/training.yaml)")
    every = [p for points in by_gpu.values() for p in points]
    pooled = None
    if every:
        m, a = fit_efficiency(every)
        pooled = TrainingEfficiency(m, a, f"no published runs on this type: fitted to all {len(every)} "
                                          f"(deploy/catalog/training.yaml, on {', '.join(sorted(names.values()))})")
    return fitted, pooled
