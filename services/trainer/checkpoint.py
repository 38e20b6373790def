"""Resumable checkpoints of a run, in <out>/checkpoints/iter-NNNNN: every rank's shard of the
model and optimizer and its own LR schedule, RNG state and policy version (the learner writes
those), and rank 0's trainer state (the iteration, the ledger of prompts trained per
iteration, the run's counters, what job it belongs to). A checkpoint is written into
iter-NNNNN.tmp and renamed into place once a manifest with every file's size and SHA-256 is
written last: a directory without a good manifest is never used (the layout and the
JobIdentity are the core's, streamrl/checkpoints.py). Knows files and records, not tensors."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from streamrl.checkpoints import (
    CHECKPOINTS_DIR,
    MANIFEST,
    RUN_FILE,
    STAGING_SUFFIX,
    STATE,
    JobIdentity,
    checkpoint_name,
)
from streamrl.records import CheckpointInfo

log = logging.getLogger(__name__)


class CheckpointRefused(RuntimeError):
    """A checkpoint of another job lies where this job's would (never used, never overwritten)."""


class TrainerState(BaseModel):
    """Rank 0's part of a checkpoint (trainer.json)."""

    model_config = ConfigDict(frozen=True)

    identity: JobIdentity
    run_id: str
    incarnation: int
    iteration: int
    """Iterations trained: a resume continues with this one."""
    policy_version: int
    world_size: int
    time_unix: float
    ledger: list[list[str]]
    """The prompt ids trained in each iteration so far, iteration by iteration."""
    counters: dict[str, int | dict[str, int]]
    """The rollout's counters when it was taken."""


class RunStart(BaseModel):
    """trainer-run.json: the run's id and how many times its trainer has started."""

    run_id: str
    starts: int


def begin_start(out_dir: Path, new_run_id: Callable[[], str]) -> RunStart:
    """Count this start of the trainer in <out>/trainer-run.json: the run keeps its id, and
    the incarnation (starts - 1) grows with every start, resumed or not."""
    path = Path(out_dir) / RUN_FILE
    previous = RunStart.model_validate_json(path.read_text()) if path.exists() else None
    start = RunStart(run_id=previous.run_id if previous else new_run_id(),
                     starts=previous.starts + 1 if previous else 1)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(start.model_dump_json())
    tmp.replace(path)
    return start


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Checkpoints:
    """The run's checkpoint directory: what to resume from, a save being written, the newest
    `keep` kept."""

    def __init__(self, out_dir: Path, keep: int):
        self.root = Path(out_dir) / CHECKPOINTS_DIR
        self.keep = keep
        self.last: CheckpointInfo | None = None

    # ---- finding one --------------------------------------------------------------------
    def complete(self) -> list[Path]:
        """Checkpoint directories (renamed into place), newest first."""
        if not self.root.is_dir():
            return []
        return sorted((p for p in self.root.glob("iter-*") if p.is_dir() and not p.name.endswith(STAGING_SUFFIX)),
                      key=lambda p: p.name, reverse=True)

    def problem(self, path: Path) -> str | None:
        """Why a checkpoint directory cannot be used (None: its manifest holds)."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError) as err:
            return f"no readable {MANIFEST} ({err})"
        for name, expected in manifest.get("files", {}).items():
            f = path / name
            if not f.is_file():
                return f"{name} is missing"
            if f.stat().st_size != expected["bytes"]:
                return f"{name} has {f.stat().st_size} bytes, the manifest says {expected['bytes']}"
            if _sha256(f) != expected["sha256"]:
                return f"{name} does not match its checksum"
        if STATE not in manifest.get("files", {}):
            return f"the manifest lists no {STATE}"
        return None

    def newest(self, identity: JobIdentity) -> tuple[Path, TrainerState] | None:
        """The newest checkpoint whose manifest holds (a broken one is skipped with a warning);
        CheckpointRefused when it belongs to another job."""
        for path in self.complete():
            problem = self.problem(path)
            if problem:
                log.warning("checkpoint %s is unusable (%s): trying the one before it", path, problem)
                continue
            state = TrainerState.model_validate_json((path / STATE).read_text())
            differences = identity.differences(state.identity)
            if differences:
                raise CheckpointRefused(f"{path} belongs to another job: " + "; ".join(differences) +
                                        ". Resume it with its own job, or start this one in another --out "
                                        "(streamrl run --fresh)")
            return path, state
        return None

    # ---- writing one --------------------------------------------------------------------
    def staging(self, iteration: int) -> Path:
        """Where a checkpoint of `iteration` is written before it is complete (emptied)."""
        path = self.root / (checkpoint_name(iteration) + STAGING_SUFFIX)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def complete_save(self, staging: Path, state: TrainerState) -> CheckpointInfo:
        """Once every rank's part is on disk: the trainer state, then the manifest (last), then
        the rename into place; older checkpoints beyond `keep` are deleted."""
        (staging / STATE).write_text(state.model_dump_json())
        files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                 for p in sorted(staging.iterdir()) if p.is_file()}
        manifest = staging / MANIFEST
        manifest.write_text(json.dumps({"iteration": state.iteration, "time_unix": state.time_unix,
                                        "files": files}, indent=1))
        with open(manifest, "rb") as f:
            os.fsync(f.fileno())
        final = self.root / checkpoint_name(state.iteration)
        if final.exists():  # the same iteration saved again (a resume that saved before training on)
            shutil.rmtree(final)
        staging.rename(final)
        for old in self.complete()[self.keep:]:
            shutil.rmtree(old, ignore_errors=True)
        self.last = CheckpointInfo(iteration=state.iteration, time_unix=state.time_unix, path=str(final))
        log.info("checkpoint of iteration %d written: %s", state.iteration, final)
        return self.last

    def clear_staging(self) -> None:
        """Drop what a killed trainer left half-written."""
        for path in self.root.glob("iter-*" + STAGING_SUFFIX):
            shutil.rmtree(path, ignore_errors=True)
