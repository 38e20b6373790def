"""The progress bar of a local run: the trainer's /status (a TrainerStatus) every half
second until the trainer exits for good (a tick may restart it), and a warning when another
process exits with an error. Each tick is handed the status just read. Knows nothing of what
the ticks it runs do."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from streamrl.local.launch import Services
from streamrl.local.plan import RunPlan
from streamrl.records import METRICS_FILE, IterationRecord, TrainerPhase, TrainerStatus

POLL_S = 0.5
STARTING = (TrainerPhase.LOADING, TrainerPhase.RESUMING)
"""A (re)started trainer's phases before its iterations count again: the bar says what it does."""
Say = Callable[[str], None]
Tick = Callable[[Say, TrainerStatus | None], None]
"""What runs every poll: given `say` (prints above the bar) and the trainer's status just read
(None: it did not answer)."""


def show_progress(plan: RunPlan, services: Services, quiet: bool,
                  tick: Tick = lambda say, status: None) -> None:
    """Show progress until the trainer exits and `tick(say, status)`, which runs every POLL_S,
    has not started it again. Exceptions from `tick` end the wait (the caller stops the run)."""
    from tqdm import tqdm

    job = plan.job
    bar = tqdm(total=job.spec.algorithm.num_iterations, unit="it", desc=job.metadata.name, disable=quiet,
               dynamic_ncols=True)
    say = (lambda msg: None) if quiet else bar.write
    shown = 0
    failed: set[str] = set()
    try:
        with httpx.Client(timeout=2.0) as http:
            while True:
                alive = services.trainer.running()
                status = _status(http, f"{services.trainer_admin}/status") if alive else None
                if status is not None and status.phase in STARTING:  # its model or a checkpoint loads
                    bar.set_postfix_str(status.doing())
                elif status is not None:
                    bar.update(status.iteration - shown)
                    shown = status.iteration
                    last = status.last
                    bar.set_postfix(
                        v=status.policy_version, gens=len(status.generators), samples_s=f"{status.samples_per_s:.0f}",
                        reward=f"{last.reward_mean:.3f}" if last else "nan",
                        bubble=f"{last.pipeline_bubble_ratio:.2f}" if last else "nan")
                for child in services.children():
                    if child.name not in failed and not child.running() and child.proc.returncode != 0 \
                            and child.role != "trainer":  # the trainer's exits are the tick's to tell
                        failed.add(child.name)
                        bar.write(f"warning: {child.name} exited with {child.proc.returncode}; see {child.log_path}")
                tick(say, status)
                if not alive and not services.trainer.running():  # exited, and not restarted
                    break
                time.sleep(POLL_S)
        metrics = plan.out_dir / METRICS_FILE
        if metrics.exists():  # iterations finished between the last poll and the exit
            bar.update(len(IterationRecord.read_lines(metrics)) - shown)
    finally:
        bar.close()


def _status(http: httpx.Client, url: str) -> TrainerStatus | None:
    """The trainer's status; None while it does not answer (on its way out). A body that is
    not a TrainerStatus raises: a renamed field fails here, not silently in the bar."""
    try:
        reply = http.get(url)
    except httpx.HTTPError:
        return None
    return TrainerStatus.model_validate_json(reply.content) if reply.status_code == 200 else None
