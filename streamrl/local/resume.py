"""What `streamrl run` does with a run directory an earlier start left, decided from that run's
records before anything starts: nothing (the run is complete), refuse (the directory holds
another job's checkpoints: a GRPO run's for a PPO job, say), continue it (the job now asks for
more iterations), resume it (it stopped early) or start. Reads files and records only: no torch,
no process. The job identity compared is the trainer's (streamrl/checkpoints.py), less the model's
shape, which only the model's files tell: the trainer still decides what it resumes from."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from streamrl.checkpoints import JobIdentity, list_complete
from streamrl.records import LOCAL_RUN_FILE, SUMMARY_FILE, LocalRun, RunSummary, TrainerPhase
from streamrl.spec import RLJob, load_job

MODEL_DIR = "model"
"""<out>/model: the final model the trainer writes on its way out."""
REPORT_FILE = Path("report") / "report.md"
"""<out>/report/report.md: the run's report (streamrl.report)."""
JOB_FILE = "job.yaml"
"""<out>/job.yaml: the job as the run's processes read it (RunPlan.job_file)."""


class Start(StrEnum):
    """What a start in the run directory does."""

    NEW = "new"
    """No earlier run to go on from: train from iteration 0."""
    RESUME = "resume"
    """Checkpoints of a run that stopped early (or of another job, which the trainer refuses)."""
    CONTINUE = "continue"
    """The run completed, and the job now asks for more iterations: train those."""
    COMPLETE = "complete"
    """The run trained every iteration the job asks for: start nothing."""
    REFUSED = "refused"
    """The directory holds another job's run (its checkpoints would be refused): start nothing."""


@dataclass(frozen=True)
class Resume:
    """What a start in a run directory does, and what to tell the user first (None: nothing)."""

    start: Start
    message: str | None = None


def decide(out_dir: Path, job: RLJob) -> Resume:
    """What `streamrl run job --out out_dir` does with what out_dir holds. Complete: the run's own
    records say it is done for this job (summary.json Succeeded after at least the job's
    numIterations, run.json with the trainer's exit 0 and no failure, the final model written,
    job.yaml the same job as far as a checkpoint must match). Continue: the same, with fewer
    iterations than the job asks for and a checkpoint to go on from."""
    out_dir = Path(out_dir)
    wanted = job.spec.algorithm.num_iterations
    checkpoints = [p.name for p in reversed(list_complete(out_dir))]
    earlier = _earlier_job(out_dir)
    differences = JobIdentity.of(job, None).differences(JobIdentity.of(earlier, None)) if earlier else None
    if differences and checkpoints:
        return Resume(Start.REFUSED, _refused(out_dir, checkpoints[-1], differences))
    # the same job, as far as its file tells (a model's shape only its files tell: a changed model spec
    # leaves the decision to the trainer)
    same_job = differences == [] and earlier is not None and earlier.spec.model == job.spec.model
    summary = _finished(out_dir) if same_job else None
    if summary is not None and summary.num_iterations >= wanted and (out_dir / MODEL_DIR / "config.json").is_file():
        return Resume(Start.COMPLETE, _complete(out_dir, summary, wanted))
    if summary is not None and summary.num_iterations < wanted and checkpoints:
        return Resume(Start.CONTINUE, f"continuing {out_dir}: it trained {summary.num_iterations} iterations, the "
                                      f"job now asks for {wanted} (from {checkpoints[-1]}; --fresh starts over in a "
                                      "new directory)")
    if checkpoints:
        return Resume(Start.RESUME, f"resuming: {out_dir} holds checkpoints up to {checkpoints[-1]}; the trainer "
                                    "continues from the newest that is whole (--fresh starts over in a new directory)")
    return Resume(Start.NEW)


def _earlier_job(out_dir: Path) -> RLJob | None:
    """The job the run in out_dir was started with (its job.yaml); None when there is none, or
    it does not parse (another version wrote it: then the trainer decides from its checkpoint)."""
    try:
        return load_job(out_dir / JOB_FILE)
    except (OSError, ValueError):  # missing or unreadable; load_job's SpecError is a ValueError
        return None


def _finished(out_dir: Path) -> RunSummary | None:
    """The summary of the run in out_dir when it ended well (Succeeded, the trainer's exit 0, no
    failure); None otherwise. A record another version wrote, that does not parse, decides nothing."""
    try:
        summary = RunSummary.read(out_dir / SUMMARY_FILE)
        runner = LocalRun.read(out_dir / LOCAL_RUN_FILE)  # a start deletes it; its end writes it
    except (OSError, ValueError):
        return None
    if summary.phase != TrainerPhase.SUCCEEDED or runner.trainer_exit_code != 0 or runner.failure:
        return None
    return summary


def _refused(out_dir: Path, newest: str, differences: list[str]) -> str:
    lines = [f"refused: {out_dir} holds the checkpoints (up to {newest}) of another job; its trainer would refuse "
             "them, and they are not overwritten. What differs:"]
    lines += [f"  {d.replace('in the checkpoint', 'in the earlier job')}" for d in differences]
    lines.append("run this job with --fresh (a new directory beside it) or another --out, or run the earlier job's "
                 f"file ({out_dir / JOB_FILE}) to go on with that run")
    return "\n".join(lines)


def _complete(out_dir: Path, summary: RunSummary, wanted: int) -> str:
    trained = summary.num_iterations
    how = (f"trained all {wanted} iterations the job asks for" if trained == wanted else
           f"trained {trained} iterations, more than the {wanted} the job asks for")
    lines = [f"complete: {out_dir} {how}; nothing to start",
             f"  summary: {out_dir / SUMMARY_FILE} ({summary.num_samples} samples, {summary.samples_per_s:.1f} "
             f"samples/s, reward {summary.reward_first or 0:.3f} -> {summary.reward_last or 0:.3f})",
             f"  model:   {out_dir / MODEL_DIR}"]
    if (out_dir / REPORT_FILE).is_file():
        lines.append(f"  report:  {out_dir / REPORT_FILE}")
    lines.append("raise algorithm.numIterations to train on from its last checkpoint, or --fresh to start over "
                 "in a new directory")
    return "\n".join(lines)
