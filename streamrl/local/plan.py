"""What a local run will start, decided from the job and the flags before anything starts:
its processes and their Prometheus labels, their admin ports and the trainer's gRPC port
(fixed in the run's job, so a restarted trainer listens where its generators dial), the
cores it may use, whether its generators are elastic. The run directory is absolute, as is
every path handed to another program. Starts nothing."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from streamrl.local.ports import free_port
from streamrl.models import model_spec_summary
from streamrl.records import LOCAL_RUN_FILE, SCALING_FILE
from streamrl.spec import PipelineMode, RLJob, dump_job


@dataclass(frozen=True)
class RunPlan:
    """Everything decided before a process starts; the launcher, monitor and autoscaler read it."""

    job: RLJob
    out_dir: Path
    """The run directory, absolute (a relative --out is resolved once, against the cwd)."""
    cores: int
    """Cores the run may use: --cores, else those this process may run on."""
    elastic: bool
    """autoscaling.mode Internal with generator processes to scale."""
    prometheus_for: str | None
    """Why the run starts its own Prometheus (the flag or field asking for it); None: it does not."""
    processes: dict[str, dict[str, str]]
    """{process name: Prometheus labels} of every process started up front (plan_processes)."""
    admin_ports: dict[str, int]
    """Each of those processes' admin port, chosen up front so Prometheus scrapes each one
    from the moment it listens (a counter first seen mid-run loses its start to rate())."""

    @property
    def job_file(self) -> Path:
        """The validated job, as every process reads it."""
        return self.out_dir / "job.yaml"

    def prepare(self) -> None:
        """The run directory, with the job written out and none of the runner's records of an earlier run."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.job_file.write_text(dump_job(self.job))
        for name in (SCALING_FILE, LOCAL_RUN_FILE):
            (self.out_dir / name).unlink(missing_ok=True)

    def describe(self) -> str:
        spec = self.job.spec
        return (f"streamrl run {self.job.metadata.name}: mode {spec.pipeline.mode.value}, "
                f"model {model_spec_summary(spec.model)}, {sum(spec.generators.pool_replicas().values())} generator "
                f"replica(s){f' (elastic, up to {self.cores} cores)' if self.elastic else ''}, out {self.out_dir}")


def available_cores() -> list[int]:
    """The cores this process may run on (empty where the platform cannot say)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def plan_run(job: RLJob, out_dir: Path | None, prometheus: bool, cores: int | None,
             say: Callable[[str], None]) -> RunPlan:
    """The plan for `streamrl run` with these flags; ValueError naming a bad one."""
    spec = job.spec
    available = len(available_cores()) or os.cpu_count() or 1
    if cores is not None and cores < 1:
        raise ValueError(f"--cores must be at least 1, got {cores}")
    if cores is not None and cores > available:
        say(f"warning: --cores {cores} is more than the {available} this process may run on: processes share cores")
    elastic = spec.autoscaling.mode == "Internal" and spec.pipeline.mode != PipelineMode.colocated
    if spec.autoscaling.mode == "Internal" and not elastic:
        say("autoscaling.mode Internal: colocated mode has no generator replicas to scale; replicas stay as written")
    if spec.autoscaling.mode == "External":
        say("autoscaling.mode External: nothing drives /scale in a local run; replicas stay as written")
    if spec.trainer.nodes > 1:
        raise ValueError(f"spec.trainer.nodes {spec.trainer.nodes}: a local run is one node; put the ranks in "
                         "trainer.processesPerNode instead")
    prometheus_for = "--prometheus" if prometheus else \
        "spec.autoscaling.mode Internal (local autoscaling reads its inputs from Prometheus)" if elastic else None
    out_dir = out_dir or Path("runs") / f"{job.metadata.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    processes = plan_processes(job)
    return RunPlan(with_trainer_port(job), Path(out_dir).resolve(), cores or available, elastic, prometheus_for,
                   processes, {name: free_port() for name in processes})


def with_trainer_port(job: RLJob) -> RLJob:
    """The job with a free trainer gRPC port written in where it says 0 (any): a trainer the
    run restarts listens on the port its generators dial again. Colocated mode listens on none."""
    trainer = job.spec.trainer
    if trainer.port or job.spec.pipeline.mode == PipelineMode.colocated:
        return job
    spec = job.spec.model_copy(update={"trainer": trainer.model_copy(update={"port": free_port()})})
    return job.model_copy(update={"spec": spec})


def plan_processes(job: RLJob) -> dict[str, dict[str, str]]:
    """{process name: its Prometheus labels} of every process a local run starts up front."""
    spec = job.spec
    out = {}
    if spec.generators.dispatch.policy == "skewness-aware":
        out["ranker"] = {"role": "ranker"}
    out["trainer"] = {"role": "trainer"}
    for rank in range(1, spec.trainer.processes_per_node):  # a local run is one node
        out[trainer_rank_process(rank)] = {"role": "trainer", "rank": str(rank)}
    if spec.pipeline.mode != PipelineMode.colocated:
        for pool in spec.generators.pools:
            out.update(generator_process(pool.name, i) for i in range(spec.generators.pool_replicas()[pool.name]))
    return out


def trainer_rank_process(rank: int) -> str:
    """The process name of a trainer rank other than 0 (rank 0 is `trainer`)."""
    return f"trainer-rank-{rank}"


def generator_process(pool: str, index: int) -> tuple[str, dict[str, str]]:
    """(process name, Prometheus labels) of a pool's index-th replica (ids are never reused)."""
    gid = f"{pool}-{index}"
    return f"generator-{gid}", {"role": "generator", "pool": pool, "replica": gid}
