"""A run's checkpoints as files, and what job they belong to: the layout of <out>/checkpoints
(iter-NNNNN, written as iter-NNNNN.tmp and renamed into place once its manifest is written
last) and the one JobIdentity that decides whether a checkpoint may be resumed by a job. The
trainer (services/trainer/checkpoint.py writes and checks the files) and the local runner
(streamrl/local/resume.py decides before anything starts) both read them from here. No torch:
files and records only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from streamrl.spec import RLJob

CHECKPOINTS_DIR = "checkpoints"
"""<out>/checkpoints: one directory per checkpoint."""
STAGING_SUFFIX = ".tmp"
"""A checkpoint being written: iter-NNNNN.tmp, never used."""
MANIFEST = "manifest.json"
"""Written last into a checkpoint: every file's size and SHA-256. Without it the directory is never used."""
STATE = "trainer.json"
"""Rank 0's trainer state in a checkpoint (the iteration, the ledger, the counters, the JobIdentity)."""
RUN_FILE = "trainer-run.json"
"""<out>/trainer-run.json: the run's id and how many times its trainer has started."""

IDENTITY_FIELDS: dict[str, tuple[str, ...]] = {
    "algorithm": ("type", "groupSize", "promptsPerStep", "seed"),
    "task": ("name", "seed", "numPrompts", "curriculum"),
}
"""The spec fields (by their names in the RLJob) a checkpoint must match: the algorithm's type
(a PPO checkpoint holds a critic, a GRPO one none) and batch shape, its seed, and the task's
prompts. The operator's CRD makes the same fields immutable on a running job (operator/src/crd.py).
Other fields (learning rate, iterations, generators, pipeline) may change across a resume."""
MODEL_SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "intermediate_size", "vocab_size")
"""The keys of a model's config.json a checkpoint's shards must match."""


def checkpoint_name(iteration: int) -> str:
    """The directory of the checkpoint taken after `iteration` iterations."""
    return f"iter-{iteration:05d}"


def list_complete(out_dir: Path) -> list[Path]:
    """The run's checkpoints renamed into place with a manifest, newest first (their files are
    checked against the manifest only when one is used: services/trainer/checkpoint.py)."""
    root = Path(out_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return sorted((p for p in root.glob("iter-*") if p.is_dir() and not p.name.endswith(STAGING_SUFFIX)
                   and (p / MANIFEST).exists()), key=lambda p: p.name, reverse=True)


class JobIdentity(BaseModel):
    """What a checkpoint must match to be resumed by a job: the model's shape and the
    IDENTITY_FIELDS of its spec. Stored in each checkpoint (trainer.json, by section)."""

    model_config = ConfigDict(frozen=True)

    model: dict[str, int | str]
    """The model's shape (MODEL_SHAPE_KEYS of its config.json); empty where no model was read."""
    algorithm: dict[str, int | float | str]
    task: dict[str, int | str | bool]

    @field_validator("algorithm", mode="before")
    @classmethod
    def _grpo_by_default(cls, value: Any) -> Any:
        """Checkpoints written before the algorithm's type was part of the identity were GRPO's."""
        return {"type": "grpo", **value} if isinstance(value, dict) else value

    @classmethod
    def of(cls, job: RLJob, model_config: dict[str, Any] | None) -> JobIdentity:
        """The identity of `job`, with the shape of the model whose config.json is `model_config`
        (the trainer passes it; the local runner, which has read no model yet, passes None and
        compares the rest)."""
        spec = job.spec.model_dump(mode="json", by_alias=True)
        sections = {section: {key: spec[section][key] for key in keys} for section, keys in IDENTITY_FIELDS.items()}
        model = {k: model_config[k] for k in MODEL_SHAPE_KEYS if k in model_config} if model_config else {}
        return cls(model=model, **sections)

    def without_model(self) -> JobIdentity:
        """The same identity with the model's shape left out (what a job's file alone tells)."""
        return self.model_copy(update={"model": {}})

    def differences(self, other: JobIdentity) -> list[str]:
        """'section.key: theirs in the checkpoint, ours in this job' for every field that differs."""
        out = []
        for section in ("model", "algorithm", "task"):
            mine, theirs = getattr(self, section), getattr(other, section)
            for key in sorted(set(mine) | set(theirs)):
                if mine.get(key) != theirs.get(key):
                    out.append(f"{section}.{key}: {theirs.get(key)!r} in the checkpoint, {mine.get(key)!r} in this job")
        return out
