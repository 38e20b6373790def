"""The hardware catalog: GPU types with their published specs and a relative cost, and named
model shapes, read from YAML files (`deploy/catalog/*.yaml`, plus any folder a user adds).
Knows specs and prices as written; nothing of what a stage costs in seconds (roofline.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from streamrl.planning.shape import ModelShape

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
    kind: Literal["request", "prefill"]
    """`request`: `batch` sequences of `input_tokens` prompts each generate `output_tokens`,
    end to end; `prefill`: the first token of `batch` such prompts."""
    batch: int = Field(default=1, ge=1)
    input_tokens: int = Field(ge=1)
    output_tokens: int = Field(default=0, ge=0)
    seconds: float = Field(gt=0)
    """What was measured, in seconds (a throughput is turned into the batch's seconds: `derived`)."""
    derived: str = ""
    """How `seconds` follows from the published figure, where it is not one itself."""
    source: str
    quote: str
    """The published figure as its source prints it."""


class _CatalogFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    gpus: list[GpuType] = Field(default_factory=list)
    models: list[ModelShape] = Field(default_factory=list)
    measurements: list[Measurement] = Field(default_factory=list)


class Catalog:
    """GPU types and model shapes by name (case-insensitive)."""

    def __init__(self, gpus: list[GpuType], models: list[ModelShape], folders: tuple[Path, ...] = (),
                 measurements: list[Measurement] | None = None):
        self._gpus = {g.name.lower(): g for g in gpus}
        self._models = {m.name.lower(): m for m in models}
        self.measurements = list(measurements or [])
        """Published engine measurements (the roofline's calibration table); a later file's row
        replaces a same-named one."""
        self.folders = folders

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
    return Catalog(list(gpus.values()), list(models.values()), tuple(chain), list(measurements.values()))
