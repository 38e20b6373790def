"""The hardware catalog: GPU types with their published specs and a relative cost, and named
model shapes, read from YAML files (`deploy/catalog/*.yaml`, plus any folder a user adds).
Knows specs and prices as written; nothing of what a stage costs in seconds (roofline.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from streamrl.planning.shape import ModelShape
from streamrl.planning.training_fit import PublishedTrainingRun, training_efficiencies

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "deploy" / "catalog"
"""The catalog shipped with the checkout; `STREAMRL_CATALOG` (folders separated by `:`) or
`--catalog` add folders whose entries replace same-named ones."""


class GpuType(BaseModel):
    """One GPU type, as its vendor's datasheet gives it (dense figures, no sparsity)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")
    """How plans and budgets name it (`H20`, `A100-80GB`); matched case-insensitively."""
    bf16_tflops: float = Field(gt=0)
    """Peak dense BF16 tensor-core TFLOP/s of one GPU."""
    hbm_gb_s: float = Field(gt=0)
    """Peak memory bandwidth of one GPU, GB/s (10^9 bytes)."""
    memory_gb: float = Field(gt=0)
    """Memory of one GPU, GB (10^9 bytes)."""
    interconnect_gb_s: float = Field(gt=0)
    """GPU-to-GPU bandwidth within a node, GB/s per GPU as the datasheet states it (NVLink's
    total of both directions; PCIe for cards without NVLink): tensor-parallel all-reduces and
    the trainer's gathers go over it."""
    gpus_per_node: int = Field(default=8, ge=1, le=64)
    """GPUs of one machine: tensor parallelism stays within it, a trainer pod takes up to this many."""
    relative_cost: float = Field(gt=0)
    """Cost of one GPU for the time it is held, relative to the others (your price list's
    ratio; only ratios matter)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Kubernetes node labels of machines with this GPU (a planned RLJob's placement)."""
    sources: list[str] = Field(default_factory=list)
    """Where each figure comes from (datasheet addresses, papers)."""
    training_like: str | None = None
    """Another GPU type whose training efficiencies this one takes when it has no published
    training measurements of its own (the same chip and clocks: H800 and H200 train like H100)."""
    train_matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of the peak that training's matmuls reach. Leave it out: the catalog fits it to
    the published measurements (deploy/catalog/training.yaml) on this type, on `training_like`'s,
    or on all of them; set it to use your own."""
    train_attention_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of the peak that training's (flash) attention reaches; as train_matmul_efficiency."""
    train_efficiency_note: str = ""
    """Where the two training efficiencies come from (the catalog writes it when it fits them)."""

    @model_validator(mode="after")
    def _efficiencies_together(self) -> GpuType:
        if (self.train_matmul_efficiency is None) != (self.train_attention_efficiency is None):
            raise ValueError("train_matmul_efficiency and train_attention_efficiency: give both or neither")
        return self


class Measurement(BaseModel):
    """One published measurement of a serving engine at a fixed batch, which the roofline's
    decode and prefill factors are fitted to (`calibration.fit_measurements`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    name: str
    engine: str
    """The engine and version as the source states it (`vllm`, `lmdeploy 0.1.0a1`)."""
    gpu: str
    """A GPU type of the catalog."""
    tp: int = Field(default=1, ge=1, le=64)
    model: str
    """A model shape of the catalog."""
    kind: Literal["request", "prefill", "throughput"]
    """`request`: `batch` sequences of `input_tokens` prompts each generate `output_tokens`,
    end to end; `prefill`: the first token of `batch` such prompts; `throughput`: an offline
    run at full load (many such requests queued at once, the engine choosing its batch), the
    output tokens/s of the whole tensor-parallel group."""
    batch: int = Field(default=1, ge=1)
    input_tokens: int = Field(ge=1)
    output_tokens: int = Field(default=0, ge=0)
    seconds: float | None = Field(default=None, gt=0)
    """What was measured, in seconds (a throughput is turned into the batch's seconds: `derived`);
    `request` and `prefill` rows."""
    output_tokens_per_s: float | None = Field(default=None, gt=0)
    """`throughput` rows: output tokens/s of the replica."""
    derived: str = ""
    """How the figure follows from the published one, where it is not one itself."""
    use: Literal["fit", "check"] = "fit"
    """`fit`: the decode and prefill factors are fitted to it; `check`: only compared with (held out)."""
    note: str = ""
    source: str
    quote: str
    """The published figure as its source prints it."""

    @model_validator(mode="after")
    def _one_figure(self) -> Measurement:
        if self.kind == "throughput":
            if self.output_tokens_per_s is None or self.seconds is not None or self.output_tokens < 1:
                raise ValueError("a throughput row gives output_tokens_per_s (and output_tokens), not seconds")
        elif self.seconds is None or self.output_tokens_per_s is not None:
            raise ValueError(f"a {self.kind} row gives seconds, not output_tokens_per_s")
        return self


class _CatalogFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    gpus: list[GpuType] = Field(default_factory=list)
    models: list[ModelShape] = Field(default_factory=list)
    measurements: list[Measurement] = Field(default_factory=list)
    training: list[PublishedTrainingRun] = Field(default_factory=list)


class Catalog:
    """GPU types and model shapes by name (case-insensitive)."""

    def __init__(self, gpus: list[GpuType], models: list[ModelShape], folders: tuple[Path, ...] = (),
                 measurements: list[Measurement] | None = None, training: list[PublishedTrainingRun] | None = None):
        self._models = {m.name.lower(): m for m in models}
        self.measurements = list(measurements or [])
        """Published engine measurements (the roofline's decode calibration table); a later
        file's row replaces a same-named one."""
        self.training = list(training or [])
        """Published training throughputs (the roofline's training calibration table)."""
        self.folders = folders
        self._gpus = {g.name.lower(): g for g in _with_training_efficiencies(gpus, self._models, self.training)}

    @property
    def gpus(self) -> list[GpuType]:
        return sorted(self._gpus.values(), key=lambda g: g.name)

    @property
    def models(self) -> list[ModelShape]:
        return sorted(self._models.values(), key=lambda m: m.name)

    def gpu(self, name: str, field: str = "gpu type") -> GpuType:
        """The GPU type called `name`; ValueError naming `field`, the name and the known types."""
        found = self._gpus.get(name.lower())
        if found is None:
            known = ", ".join(g.name for g in self.gpus) or "none"
            raise ValueError(f"{field} {name!r}: not in the GPU catalog (known: {known}); add it to a YAML file "
                             f"under {self._where()}")
        return found

    def model(self, name: str) -> ModelShape:
        found = self._models.get(name.lower())
        if found is None:
            known = ", ".join(m.name for m in self.models) or "none"
            raise ValueError(f"model {name!r}: not in the catalog (known: {known}); give a config.json path "
                             f"or add it under {self._where()}")
        return found

    def _where(self) -> str:
        return " or ".join(str(f) for f in self.folders) or str(DEFAULT_DIR)


def _with_training_efficiencies(gpus: list[GpuType], models: dict[str, ModelShape],
                                training: list[PublishedTrainingRun]) -> list[GpuType]:
    """Each GPU type with its training efficiencies: its own if set, else fitted to the training
    rows on it, else its `training_like` type's, else fitted to every row (none without rows)."""
    by_name = {g.name.lower(): g for g in gpus}
    fitted, pooled = training_efficiencies(training, models, {k: g.bf16_tflops * 1e12 for k, g in by_name.items()})
    out = []
    for g in gpus:
        if g.train_matmul_efficiency is not None:
            out.append(g if g.train_efficiency_note else g.model_copy(update={"train_efficiency_note": "as set"}))
            continue
        found, note = fitted.get(g.name.lower()), ""
        if found is None and g.training_like:
            like = by_name.get(g.training_like.lower())
            if like is None:
                raise ValueError(f"gpu {g.name}: training_like {g.training_like!r} is not a GPU type of the catalog")
            found = fitted.get(like.name.lower())
            note = f"{like.name}'s (training_like): " if found else ""
        found = found or pooled
        if found is None:
            out.append(g)
            continue
        out.append(g.model_copy(update={"train_matmul_efficiency": round(found.matmul, 4),
                                        "train_attention_efficiency": round(found.attention, 4),
                                        "train_efficiency_note": note + found.note}))
    return out


def _load_file(path: Path) -> _CatalogFile:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"catalog {path}: cannot read: {err}") from None
    try:
        return _CatalogFile.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".")
            msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
            problems.append(f"  {loc}: {msg}")
        raise ValueError(f"catalog {path}: invalid\n" + "\n".join(problems)) from None


def load_catalog(folders: list[Path] | None = None) -> Catalog:
    """The shipped catalog, then `STREAMRL_CATALOG`'s folders, then `folders`: each folder's
    `*.yaml` files in name order; a later entry replaces an earlier one of the same name."""
    chain = [DEFAULT_DIR] if DEFAULT_DIR.is_dir() else []
    chain += [Path(p) for p in os.environ.get("STREAMRL_CATALOG", "").split(":") if p]
    chain += [Path(p) for p in folders or []]
    gpus: dict[str, GpuType] = {}
    models: dict[str, ModelShape] = {}
    measurements: dict[str, Measurement] = {}
    training: dict[str, PublishedTrainingRun] = {}
    for folder in chain:
        if not folder.is_dir():
            raise ValueError(f"catalog folder {folder}: not a directory")
        for path in sorted(folder.glob("*.yaml")):
            loaded = _load_file(path)
            for g in loaded.gpus:
                gpus[g.name.lower()] = g
            for m in loaded.models:
                models[m.name.lower()] = m
            for row in loaded.measurements:
                measurements[row.name] = row
            for trained in loaded.training:
                training[trained.name] = trained
    return Catalog(list(gpus.values()), list(models.values()), tuple(chain), list(measurements.values()),
                   list(training.values()))
