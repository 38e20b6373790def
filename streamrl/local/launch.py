"""Starting a local run's processes: the ranker when dispatch needs it, the trainer, then
every generator replica (and later ones the supervisor or the autoscaler asks for), each
pinned to cores of its own where there are enough. Knows nothing of Prometheus or scaling."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from streamrl.local import RunFailed
from streamrl.local.children import Child, spawn, stop
from streamrl.local.plan import RunPlan, available_cores, generator_process, trainer_rank_process
from streamrl.local.ports import free_port
from streamrl.local.zygote import Zygote
from streamrl.spec import PipelineMode


class CorePlanner:
    """Hands out CPU cores round-robin so local processes do not fight over them."""

    def __init__(self, cores: list[int] | None = None):
        self.cores = available_cores() if cores is None else cores
        self._next = 0

    def take(self, n: int) -> list[int]:
        if not self.cores:
            return []
        out = [self.cores[(self._next + i) % len(self.cores)] for i in range(min(n, len(self.cores)))]
        self._next += n
        return out


class GeneratorLauncher:
    """Starts generator replicas of a running job: at start-up and whenever the supervisor
    or the autoscaler asks for one. Replica ids are <pool>-<n>, never reused within a run."""

    def __init__(self, plan: RunPlan, model_dir: Path, trainer_address: str, cores: CorePlanner,
                 zygote: Zygote | None = None):
        self.plan, self.model_dir, self.trainer_address, self.cores = plan, model_dir, trainer_address, cores
        self.zygote = zygote
        """Where replicas are forked from (None: each starts a fresh interpreter)."""
        self.pools = {p.name: p for p in plan.job.spec.generators.pools}
        self.started: dict[str, int] = {}
        self.children: list[Child] = []
        """Every replica started in this run (also those that left)."""

    def start(self, pool_name: str, admin_port: int | None = None) -> Child:
        pool, out = self.pools[pool_name], self.plan.out_dir
        n = self.started[pool_name] = self.started.get(pool_name, 0) + 1
        name, labels = generator_process(pool_name, n - 1)
        endpoint = out / "endpoints" / f"{name}.json"
        endpoint.parent.mkdir(exist_ok=True)
        endpoint.unlink(missing_ok=True)
        admin_port = admin_port or free_port()
        child = spawn(
            name,
            ["generator", str(self.plan.job_file), "--trainer", self.trainer_address, "--pool", pool.name,
             "--id", labels["replica"], "--model-dir", str(self.model_dir), "--admin-port", str(admin_port),
             "--endpoint-file", str(endpoint), "--timeline", str(out / "timeline" / f"{name}.jsonl")],
            pool.threads, self.cores.take(pool.threads), out / "logs", self.zygote)
        child.endpoint_file, child.admin_port, child.labels = endpoint, admin_port, labels
        self.children.append(child)
        return child


@dataclass
class Services:
    """A local run's processes, as started."""

    trainer: Child
    trainer_admin: str
    """The trainer's admin URL (its /status)."""
    launcher: GeneratorLauncher
    """Starts generator replicas (none in colocated mode)."""
    ranker: Child | None = None
    trainer_ranks: list[Child] = field(default_factory=list)
    """The trainer's other ranks (rank 0 is `trainer`), when it is sharded."""

    def children(self) -> list[Child]:
        """Every process started, ranker and trainer first (also those that exited)."""
        return [*([self.ranker] if self.ranker else []), self.trainer, *self.trainer_ranks, *self.launcher.children]

    def check_trainer_ranks(self) -> None:
        """A trainer rank that died while rank 0 runs fails the run at once, named (rank 0 would
        otherwise wait in a collective until the process group's timeout)."""
        for child in self.trainer_ranks:
            code = child.proc.poll()
            if code not in (None, 0) and self.trainer.running():
                raise RunFailed(f"trainer rank {child.labels.get('rank')} ({child.name}) exited with {code}; "
                                f"see {child.log_path}:\n{child.tail()}")

    def stop(self, interrupted: bool = False) -> None:
        """The trainer first (it writes its checkpoint, summary and model: SIGINT when the run
        was interrupted, so it ends Interrupted; SIGTERM otherwise, Preempted and resumable),
        then the others, then the replicas' zygote."""
        stop([self.trainer], TRAINER_STOP_TIMEOUT_S, signal.SIGINT if interrupted else signal.SIGTERM)
        stop([c for c in self.children() if c is not self.trainer])
        if self.launcher.zygote is not None:
            self.launcher.zygote.close()


TRAINER_STOP_TIMEOUT_S = 60.0
"""The trainer's time to stop: its current step, a checkpoint, the summary and the model."""


def start_services(plan: RunPlan, model_dir: Path) -> Services:
    """Start every process plan.processes names, each on its planned admin port: the ranker
    when dispatch needs it, the trainer (waiting until it listens), then every generator
    replica. Whatever started is stopped again if a later one fails to."""
    spec, out = plan.job.spec, plan.out_dir
    (out / "logs").mkdir(parents=True, exist_ok=True)
    cores = CorePlanner()
    started: list[Child] = []
    colocated = spec.pipeline.mode == PipelineMode.colocated
    # Replicas fork from a zygote whose imports overlap the trainer's start-up.
    zygote = None if colocated else Zygote(out / "logs" / "zygote.log", dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        ranker = None
        if "ranker" in plan.processes:
            ranker = _start(started, "ranker", ["ranker", str(plan.job_file), "--state", str(out / "ranker.npz")],
                            plan, 1, [])  # light: it shares cores
        # Colocated alternates generation and training in one process: it gets every core.
        threads = (len(cores.cores) or 1) if colocated else spec.trainer.threads
        argv = ["trainer", str(plan.job_file), "--model-dir", str(model_dir), "--out", str(out), "--threads",
                str(threads), *(["--ranker", f"127.0.0.1:{ranker.wait_listening()['grpc_port']}"] if ranker else [])]
        world_size = spec.trainer.processes_per_node  # a local run is one node
        rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world_size)}
        # Every rank as torchrun would start them (its environment names it), on cores of its own.
        trainer, *trainer_ranks = [
            _start(started, trainer_rank_process(rank) if rank else "trainer", argv, plan, threads,
                   cores.take(threads), {**rendezvous, "RANK": str(rank), "LOCAL_RANK": str(rank)} if world_size > 1
                   else None)
            for rank in range(world_size)]
        endpoint = trainer.wait_listening()
        launcher = GeneratorLauncher(plan, model_dir, f"127.0.0.1:{endpoint['grpc_port']}", cores, zygote)
        for name, labels in plan.processes.items():  # none in colocated mode
            if labels["role"] == "generator":
                started.append(launcher.start(labels["pool"], plan.admin_ports[name]))
        return Services(trainer, f"http://127.0.0.1:{endpoint['admin_port']}", launcher, ranker, trainer_ranks)
    except BaseException:
        stop(started)
        if zygote is not None:
            zygote.close()
        raise


def _start(started: list[Child], name: str, argv: list[str], plan: RunPlan, threads: int, cores: list[int],
           env: dict[str, str] | None = None) -> Child:
    """Spawn a planned process with its endpoint file and admin port; note it in `started`."""
    endpoint = plan.out_dir / f"{name}.json"
    endpoint.unlink(missing_ok=True)
    child = spawn(name, [*argv, "--endpoint-file", str(endpoint), "--admin-port", str(plan.admin_ports[name])],
                  threads, cores, plan.out_dir / "logs", env=env)
    child.endpoint_file, child.admin_port, child.labels = endpoint, plan.admin_ports[name], plan.processes[name]
    started.append(child)
    return child
