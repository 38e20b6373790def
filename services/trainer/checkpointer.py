"""The trainer's checkpointing, in one place: which checkpoint a start resumes from (another
job's is refused), restoring it, starting a save while training goes on and completing it once
every rank's part is on disk, and the last save on the way out. The loop calls it at two points
(after an iteration, before the next); serve() builds it and calls it at the start and the end.
The files are services/trainer/checkpoint.py's; the identity and the layout are the core's
(streamrl/checkpoints.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from streamrl.checkpoints import JobIdentity
from streamrl.metrics import ServiceMetrics
from streamrl.records import CheckpointInfo, RunEvent, TrainerPhase, append_event
from streamrl.trainer.checkpoint import Checkpoints, RunStart, TrainerState
from streamrl.trainer.learner import Learner

log = logging.getLogger(__name__)

OnLearner = Callable[..., Awaitable]
"""Runs a learner call on the learner's thread as an uninterrupted section (TrainLoop._learner):
a save is a collective every rank runs to its end."""


@dataclass(frozen=True)
class PendingSave:
    """A checkpoint being written: rank 0's future (done once every rank's part is on disk), its
    staging directory and the trainer state it records."""

    future: Future | None
    staging: Path
    state: TrainerState


@dataclass(frozen=True)
class Resumed:
    """What a start resumed from."""

    path: Path
    state: TrainerState


class Checkpointer:
    """One run's checkpoints as the trainer's rank 0 sees them."""

    def __init__(self, *, checkpoints: Checkpoints, learner: Learner, identity: JobIdentity, run: RunStart,
                 metrics: ServiceMetrics, out_dir: Path):
        self.checkpoints = checkpoints
        self.learner = learner
        self.identity = identity
        self.run = run
        self.metrics = metrics
        self.out_dir = Path(out_dir)
        self.pending: PendingSave | None = None
        self.resumed: Resumed | None = None
        self.wait_s = 0.0
        """Seconds training waited on checkpoints in this start."""

    @property
    def incarnation(self) -> int:
        return self.run.starts - 1

    @property
    def resumed_from(self) -> int | None:
        """The iteration this start resumed at (None: it started anew)."""
        return self.resumed.state.iteration if self.resumed else None

    @property
    def last(self) -> CheckpointInfo | None:
        """The newest checkpoint complete on disk (resumed from or written in this start)."""
        return self.checkpoints.last

    # ---- the start ----------------------------------------------------------------------
    def find(self) -> Resumed | None:
        """The checkpoint this start resumes from: the newest whole one, None when there is
        none. Raises CheckpointRefused when it belongs to another job. What a killed trainer left
        half-written is dropped first."""
        self.checkpoints.clear_staging()
        found = self.checkpoints.newest(self.identity)
        return Resumed(*found) if found else None

    def restore(self, found: Resumed) -> None:
        """Every rank loads its part of `found`; the run's records say so (the loop restores
        its own state from found.state)."""
        self.learner.load(found.path)
        state = found.state
        self.checkpoints.last = CheckpointInfo(iteration=state.iteration, time_unix=state.time_unix,
                                               path=str(found.path))
        self.metrics.checkpoint_iteration.set(state.iteration)
        self.resumed = found
        append_event(self.out_dir, RunEvent(time_unix=time.time(), kind="resumed", process="trainer",
                                            detail=f"iteration {state.iteration} from {found.path.name} "
                                                   f"(start {self.run.starts})"))
        log.info("resuming run %s at iteration %d from %s (policy version %d; start %d of this run)",
                 self.run.run_id, state.iteration, found.path, self.learner.policy_version, self.run.starts)

    # ---- while training -----------------------------------------------------------------
    async def save(self, ledger: list[list[str]], counters: dict, on_learner: OnLearner) -> None:
        """Start a checkpoint of the iterations in `ledger` (a save still being written is
        completed first: that wait is the only time training waits on the disk). Nothing when
        the newest checkpoint, written or being written, already holds them."""
        trained = len(ledger)
        newest = self.pending.state.iteration if self.pending else (self.last.iteration if self.last else None)
        if newest == trained:
            return
        t0 = time.monotonic()
        await self.finish(wait=True)
        staging = self.checkpoints.staging(trained)
        future = await on_learner(self.learner.save, staging)
        self._waited(time.monotonic() - t0)
        state = TrainerState(identity=self.identity, run_id=self.run.run_id, incarnation=self.incarnation,
                             iteration=trained, policy_version=self.learner.policy_version,
                             world_size=self.learner.ranks.world_size, time_unix=time.time(),
                             ledger=[list(ids) for ids in ledger], counters=counters)
        self.pending = PendingSave(future, staging, state)

    async def finish(self, wait: bool) -> CheckpointInfo | None:
        """Complete the checkpoint being written once every rank's part is on disk (with `wait`,
        now; without, only if it already is): its manifest, the rename into place, the old ones
        pruned."""
        pending = self.pending
        if pending is None or (not wait and pending.future is not None and not pending.future.done()):
            return None
        t0 = time.monotonic()
        if pending.future is not None:
            await asyncio.to_thread(pending.future.result)
        self._waited(time.monotonic() - t0)
        self.pending = None
        info = await asyncio.to_thread(self.checkpoints.complete_save, pending.staging, pending.state)
        self.metrics.checkpoint_iteration.set(info.iteration)
        append_event(self.out_dir, RunEvent(time_unix=time.time(), kind="checkpoint", process="trainer",
                                            detail=f"iteration {info.iteration}"))
        return info

    def _waited(self, seconds: float) -> None:
        self.wait_s += seconds
        self.metrics.checkpoint_wait_seconds.inc(seconds)

    # ---- the end ------------------------------------------------------------------------
    async def on_the_way_out(self, phase: TrainerPhase, stopped: bool, ledger: list[list[str]], counters: dict,
                             on_learner: OnLearner) -> None:
        """A stopped run checkpoints what it trained (resumable); a save still being written
        completes. A failed run keeps its last complete checkpoint (its state may be half-changed).
        A failure here is logged: the last complete checkpoint stays."""
        try:
            if stopped and phase != TrainerPhase.FAILED and ledger:
                await self.save(ledger, counters, on_learner)
            await self.finish(wait=True)
            if phase == TrainerPhase.PREEMPTED:
                append_event(self.out_dir, RunEvent(time_unix=time.time(), kind="preempted", process="trainer",
                                                    detail=f"after iteration {len(ledger)}"))
        except Exception:
            log.exception("the checkpoint on the way out failed; the last complete one stays")
