"""`streamrl run job.yaml`: flags → what the run directory already holds (nothing to do, continue,
resume) → plan → start → supervise or scale, with progress → stop → records (run.json beside
the trainer's summary.json) → report. Each step is its own module of streamrl.local; this one
only puts them in order."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from streamrl.local import RunFailed
from streamrl.local.autoscaler import LocalAutoscaler, autoscale
from streamrl.local.launch import Services, start_services
from streamrl.local.monitor import RunMonitor
from streamrl.local.plan import RunPlan, plan_run
from streamrl.local.progress import Tick, show_progress
from streamrl.local.resume import Resume, Start, decide
from streamrl.local.supervise import Deaths, ReplicaRestarts, TrainerRestarts
from streamrl.models import resolve_model_dir
from streamrl.records import (
    LOCAL_RUN_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    LocalRun,
    RunSummary,
    TrainerStatus,
    write_json,
)
from streamrl.service import ExitCode
from streamrl.spec import load_job
from streamrl.vllm_args import check_job

Say = Callable[[str], None]
Keeper = ReplicaRestarts | LocalAutoscaler
"""What looks after the generators each tick: the restart policy, or the autoscaler."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached `streamrl run` (a `kill`, a closed terminal, a supervisor):
    the run stops as on Ctrl-C, every service with it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_stop_signal(signum: int, _frame) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):  # a second one must not cut the orderly stop short
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


def run(job_file: Path, out_dir: Path | None = None, quiet: bool = False, prometheus: bool = False,
        cores: int | None = None, fresh: bool = False) -> int:
    """Run the job to its end (or Ctrl-C, SIGTERM or SIGHUP, or a failure of the run itself);
    returns the exit status (130 after Ctrl-C, 128 + the signal's number after the others)."""
    if fresh and out_dir is not None:
        out_dir = _fresh(out_dir)
    if threading.current_thread() is not threading.main_thread():
        return _run(job_file, out_dir, quiet, prometheus, cores)
    previous = {sig: signal.signal(sig, _on_stop_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    # Ctrl-C (or kill -INT) stops the run even where it started with SIGINT ignored, as a shell
    # script's background job (`streamrl run job.yaml &`) starts: Python would keep it ignored.
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _run(job_file, out_dir, quiet, prometheus, cores)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _fresh(out_dir: Path) -> Path:
    """`out_dir`, or when it holds a run the first free <out_dir>-N beside it (never removed)."""
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return out_dir
    n = 2
    while (candidate := out_dir.with_name(f"{out_dir.name}-{n}")).exists():
        n += 1
    print(f"--fresh: {out_dir} holds a run; starting over in {candidate}", file=sys.stderr, flush=True)
    return candidate


def _run(job_file: Path, out_dir: Path | None, quiet: bool, prometheus: bool, cores: int | None) -> int:
    def warn(msg: str | None) -> None:  # failures are said even with --quiet
        print(msg, file=sys.stderr, flush=True)

    say = (lambda msg: None) if quiet else warn
    job = load_job(job_file)
    check_job(job, str(job_file))  # engine.type vllm: installed here, engineArgs known to it
    resume = decide(out_dir.resolve(), job) if out_dir is not None else Resume(Start.NEW)
    if resume.start == Start.COMPLETE:  # before anything starts or the directory changes
        warn(resume.message)
        return 0
    if resume.start == Start.REFUSED:  # the trainer would refuse the checkpoints; the directory stays as it is
        warn(resume.message)
        return ExitCode.JOB_ERROR
    if resume.start == Start.CONTINUE:
        warn(resume.message)  # said first, even with --quiet: the run goes on from a finished one
    plan = plan_run(job, out_dir, prometheus, cores, say)
    monitor = RunMonitor(plan) if plan.prometheus_for else None  # no binary: nothing starts
    plan.prepare()
    say(plan.describe())
    if resume.start == Start.RESUME:
        warn(resume.message)  # said even with --quiet: the run continues an earlier one
    model_dir = resolve_model_dir(plan.job.spec, log=say).resolve()
    services, keeper, failure, stopped_by = None, None, None, None
    try:
        if monitor is not None:
            say(f"prometheus: {monitor.start()} (data in {monitor.server.directory})")
        services = start_services(plan, model_dir)
        # an elastic run has its Prometheus (monitor)
        keeper = (autoscale(plan, services, monitor, say) if plan.elastic and monitor is not None
                  else ReplicaRestarts(services.launcher, out_dir=plan.out_dir))
        if monitor is not None:
            monitor.wait_until_scraped(services.children, say, warn)
        show_progress(plan, services, quiet, _ticks(keeper, monitor, services))
    except KeyboardInterrupt as err:
        stopped_by = err.signum if isinstance(err, Terminated) else None
        say(f"{'interrupted' if stopped_by is None else str(err)}: stopping services (the trainer writes its "
            "summary and model first)")
    except RunFailed as err:
        failure = str(err)
        warn(f"run failed: {failure}")
    finally:
        if services is not None:
            # Only a SIGTERM to the runner preempts the trainer (resumable, as a pod's would be);
            # Ctrl-C, a failed run or its end interrupt it.
            services.stop(interrupted=stopped_by is None)
        if isinstance(keeper, LocalAutoscaler):
            keeper.close()
        if monitor is not None:
            monitor.stop()
    if services is None:
        return 1 if failure else 128 + (stopped_by or signal.SIGINT)
    record = _write_records(plan, services, keeper, failure, say)
    _report(plan, say)
    code = services.trainer.proc.returncode
    if code not in (0, 130):
        warn(f"trainer failed (exit {code}):\n{services.trainer.tail()}")
    if stopped_by is not None and not record.failure:
        return 128 + stopped_by
    return 1 if record.failure else 0 if code == 0 else code or 1


def _ticks(keeper: Keeper, monitor: RunMonitor | None, services: Services) -> Tick:
    """What runs every progress poll: the trainer's restarts (said even with --quiet), the
    deaths of other processes, the supervisor (told which replicas served, by the trainer's
    status) or autoscaler, then Prometheus's targets."""
    from tqdm import tqdm

    plan = services.trainer_group.plan
    trainer, deaths = TrainerRestarts(services, plan.job.spec.trainer.restart_limit, plan.out_dir), Deaths(plan.out_dir)

    def tick(say: Say, status: TrainerStatus | None) -> None:
        trainer.tick(lambda msg: tqdm.write(msg, file=sys.stderr))
        deaths.tick(services.children())
        if isinstance(keeper, ReplicaRestarts):
            keeper.observe(status)
        keeper.tick(say)
        if monitor is not None:
            monitor.update(services.children())

    return tick


def _write_records(plan: RunPlan, services: Services, keeper: Keeper | None, failure: str | None,
                   say: Say) -> LocalRun:
    """run.json, what only this runner knows; then the done line from the trainer's summary.json."""
    record = LocalRun(
        generator_replica_seconds=round(sum(c.seconds() for c in services.launcher.children), 2),
        generator_replicas_started=len(services.launcher.children),
        trainer_exit_code=services.trainer.proc.returncode,
        trainer_restarts=services.trainer_group.starts - 1,
        autoscaling=keeper.summary() if isinstance(keeper, LocalAutoscaler) else None,
        failure=failure)
    write_json(plan.out_dir / LOCAL_RUN_FILE, record)
    if (plan.out_dir / SUMMARY_FILE).exists():
        s = RunSummary.read(plan.out_dir / SUMMARY_FILE)
        say(f"done: {s.num_iterations} iterations, {s.num_samples} samples, {s.samples_per_s:.1f} samples/s, "
            f"reward {s.reward_first or 0:.3f} -> {s.reward_last or 0:.3f}, pipeline bubble "
            f"{s.pipeline_bubble_ratio:.2f}; results in {plan.out_dir}")
    return record


def _report(plan: RunPlan, say: Say) -> None:
    if not (plan.out_dir / METRICS_FILE).exists():
        return
    try:
        from streamrl.report import write_report

        say(f"report: {write_report(plan.out_dir)[-1]}")
    except Exception as err:  # a plot must never cost the run its exit status
        say(f"warning: could not write the run report: {err!r}")
