"""Starting a local run's processes: the ranker when dispatch needs it, the trainer's ranks
(again, all of them, when the supervisor restarts the trainer), then every generator replica
(and later ones the supervisor or the autoscaler asks for), each pinned to cores of its own
where there are enough. Knows nothing of Prometheus or scaling."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from streamrl.local.children import Child, Zygote, spawn, stop
from streamrl.local.plan import RunPlan, available_cores, generator_process, trainer_rank_process
from streamrl.local.ports import free_port
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

    def __init__(self, plan: RunPlan, trainer_address: str, cores: CorePlanner, zygote: Zygote | None = None):
        self.plan, self.trainer_address, self.cores = plan, trainer_address, cores
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
             "--id", labels["replica"], "--admin-port", str(admin_port),  # no model: it boots from the trainer
             "--endpoint-file", str(endpoint), "--timeline", str(out / "timeline" / f"{name}.jsonl")],
            pool.threads, self.cores.take(pool.threads), out / "logs", self.zygote)
        child.endpoint_file, child.admin_port, child.labels = endpoint, admin_port, labels
        self.children.append(child)
        return child


class TrainerProcesses:
    """The trainer's ranks as one unit (rank 0 is `trainer`): started together and, when the
    supervisor restarts the trainer, stopped and started again together, with the same command
    line, admin ports, cores and run directory (a fresh rendezvous port: the old one may linger)."""

    def __init__(self, plan: RunPlan, argv: list[str], threads: int, cores: CorePlanner):
        self.plan, self.argv, self.threads = plan, argv, threads
        self.world_size = plan.job.spec.trainer.processes_per_node  # a local run is one node
        self.cores = [cores.take(threads) for _ in range(self.world_size)]
        """Each rank's cores, kept across restarts."""
        self.ranks: list[Child] = []
        """The ranks of the current start, rank 0 first."""
        self.starts = 0

    @property
    def leader(self) -> Child:
        return self.ranks[0]

    def start(self, started: list[Child]) -> Child:
        """Spawn every rank (noted in `started` as each starts, so a failure stops those
        already running); returns rank 0. A restart appends to the ranks' logs."""
        rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(self.world_size)}
        self.starts += 1
        new: list[Child] = []
        try:
            for rank in range(self.world_size):
                # Every rank as torchrun would start them (its environment names it), on cores of its own.
                env = {**rendezvous, "RANK": str(rank), "LOCAL_RANK": str(rank)} if self.world_size > 1 else None
                name = trainer_rank_process(rank) if rank else "trainer"
                if self.starts > 1:
                    with (self.plan.out_dir / "logs" / f"{name}.log").open("a") as log:
                        log.write(f"\n---- streamrl run: start {self.starts} of {name} ----\n")
                started.append(_start(new, name, self.argv, self.plan, self.threads, self.cores[rank], env,
                                      "a" if self.starts > 1 else "w"))
        finally:  # interrupted part-way (Ctrl-C), the ranks started so far are the ones to stop
            if new:
                self.ranks = new
        return self.leader


@dataclass
class Services:
    """A local run's processes, as started."""

    trainer_group: TrainerProcesses
    trainer_admin: str
    """The trainer's admin URL (its /status; the same port across restarts)."""
    launcher: GeneratorLauncher
    """Starts generator replicas (none in colocated mode)."""
    ranker: Child | None = None
    retired: list[Child] = field(default_factory=list)
    """Trainer ranks of earlier starts (exited)."""

    @property
    def trainer(self) -> Child:
        """Rank 0 of the trainer's current start."""
        return self.trainer_group.leader

    @property
    def trainer_ranks(self) -> list[Child]:
        """The current start's other ranks, when the trainer is sharded."""
        return self.trainer_group.ranks[1:]

    def children(self) -> list[Child]:
        """Every process of the run, ranker and trainer first (also those that exited, but not
        the trainer ranks of earlier starts: see `retired`)."""
        return [*([self.ranker] if self.ranker else []), *self.trainer_group.ranks, *self.launcher.children]

    def restart_trainer(self) -> Child:
        """Stop what is left of the trainer's ranks (SIGTERM, SIGKILL after GROUP_STOP_TIMEOUT_S:
        a rank whose peer died may be stuck in a collective) and start all of them again;
        returns the new rank 0, not waited for (it listens in a moment, on the same ports)."""
        stop([c for c in self.trainer_group.ranks if c.running()], GROUP_STOP_TIMEOUT_S)
        self.retired.extend(self.trainer_group.ranks)
        return self.trainer_group.start([])

    def stop(self, interrupted: bool = False) -> None:
        """The trainer first (it writes its checkpoint, summary and model: SIGINT when the run
        was interrupted, so it ends Interrupted; SIGTERM otherwise, Preempted and resumable),
        then the others, then the replicas' zygote."""
        stop([self.trainer], TRAINER_STOP_TIMEOUT_S, signal.SIGINT if interrupted else signal.SIGTERM)
        stop([c for c in self.children() if c is not self.trainer])
        if self.launcher.zygote is not None:
            self.launcher.zygote.close()


GROUP_STOP_TIMEOUT_S = 10.0
"""The surviving ranks' time to stop when the trainer group restarts after a rank died."""
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
    zygote = None if colocated else Zygote(out / "logs" / "zygote.log",
                                           dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    try:
        ranker = None
        if "ranker" in plan.processes:
            ranker = _start(started, "ranker", ["ranker", str(plan.job_file), "--state", str(out / "ranker.npz")],
                            plan, 1, [])  # light: it shares cores
        # Colocated alternates generation and training in one process: it gets every core.
        threads = (len(cores.cores) or 1) if colocated else spec.trainer.threads
        argv = ["trainer", str(plan.job_file), "--model-dir", str(model_dir), "--out", str(out), "--threads",
                str(threads), *(["--ranker", f"127.0.0.1:{ranker.wait_listening()['grpc_port']}"] if ranker else [])]
        group = TrainerProcesses(plan, argv, threads, cores)
        endpoint = group.start(started).wait_listening()
        launcher = GeneratorLauncher(plan, f"127.0.0.1:{endpoint['grpc_port']}", cores, zygote)
        for name, labels in plan.processes.items():  # none in colocated mode
            if labels["role"] == "generator":
                started.append(launcher.start(labels["pool"], plan.admin_ports[name]))
        return Services(group, f"http://127.0.0.1:{endpoint['admin_port']}", launcher, ranker)
    except BaseException:
        stop(started)
        if zygote is not None:
            zygote.close()
        raise


def _start(started: list[Child], name: str, argv: list[str], plan: RunPlan, threads: int, cores: list[int],
           env: dict[str, str] | None = None, log_mode: str = "w") -> Child:
    """Spawn a planned process with its endpoint file and admin port; note it in `started`."""
    endpoint = plan.out_dir / f"{name}.json"
    endpoint.unlink(missing_ok=True)
    child = spawn(name, [*argv, "--endpoint-file", str(endpoint), "--admin-port", str(plan.admin_ports[name])],
                  threads, cores, plan.out_dir / "logs", env=env, log_mode=log_mode)
    child.endpoint_file, child.admin_port, child.labels = endpoint, plan.admin_ports[name], plan.processes[name]
    started.append(child)
    return child
