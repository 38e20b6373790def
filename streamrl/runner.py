"""`streamrl run job.yaml`: the trainer and every generator replica as local processes on
loopback, each pinned to its own cores, with live progress and a clean stop on finish or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from streamrl.admin import AdminServer
from streamrl.metrics import AutoscalerMetrics
from streamrl.models import model_spec_summary, resolve_model_dir
from streamrl.prometheus.api import PrometheusAPI
from streamrl.prometheus.server import LocalPrometheus, Target, free_port
from streamrl.scaling.local import Fleet, LocalAutoscaler
from streamrl.spec import PipelineMode, RLJob, dump_job, load_job

STARTUP_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
MAX_REPLICA_RESTARTS = 3
"""Crashed generator replicas a local run replaces before it carries on without them."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    endpoint_file: Path | None = None
    """Where it writes {admin_port, ...} once listening."""
    admin_port: int | None = None
    """Its admin port, chosen for it in advance (so it is scraped from the start)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Its role (and pool and replica), as Prometheus labels."""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    """When it was seen to have exited (replica-seconds count start to end)."""

    @property
    def pool(self) -> str:
        return self.labels.get("pool", "")

    def running(self) -> bool:
        if self.proc.poll() is None:
            return True
        if self.ended is None:
            self.ended = time.monotonic()
        return False

    def seconds(self) -> float:
        self.running()
        return (self.ended or time.monotonic()) - self.started


class CorePlanner:
    """Hands out CPU cores round-robin so local processes do not fight over them."""

    def __init__(self):
        self.cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._next = 0

    def take(self, n: int) -> list[int]:
        if not self.cores:
            return []
        out = [self.cores[(self._next + i) % len(self.cores)] for i in range(min(n, len(self.cores)))]
        self._next += n
        return out


def _spawn(name: str, argv: list[str], threads: int, cores: list[int], log_dir: Path) -> Child:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false")
    log_path = log_dir / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "-m", "streamrl.cli", *argv], env=env,
                            stdout=log_path.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    if cores:
        try:
            os.sched_setaffinity(proc.pid, cores)
        except OSError:
            pass
    return Child(name, proc, log_path)


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-n:])
    except OSError:
        return ""


def _stop(children: list[Child]) -> None:
    for c in children:
        if c.proc.poll() is None:
            c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for c in children:
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()


def _wait_endpoint(path: Path, child: Child) -> dict:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if child.proc.poll() is not None:
            raise RuntimeError(f"{child.name} exited with {child.proc.returncode} before listening:\n"
                               f"{_tail(child.log_path)}")
        time.sleep(0.1)
    raise RuntimeError(f"{child.name} did not start within {STARTUP_TIMEOUT_S:.0f}s; see {child.log_path}")


def plan_processes(job: RLJob) -> dict[str, dict[str, str]]:
    """{process name: its Prometheus labels} of every process a local run starts."""
    spec = job.spec
    out = {}
    if spec.generators.dispatch.policy == "skewness-aware":
        out["ranker"] = {"role": "ranker"}
    out["trainer"] = {"role": "trainer"}
    if spec.pipeline.mode != PipelineMode.colocated:
        for pool in spec.generators.pools:
            out.update(generator_process(pool.name, i) for i in range(spec.generators.pool_replicas()[pool.name]))
    return out


def generator_process(pool: str, index: int) -> tuple[str, dict[str, str]]:
    """(process name, Prometheus labels) of a pool's index-th replica (ids are never reused)."""
    gid = f"{pool}-{index}"
    return f"generator-{gid}", {"role": "generator", "pool": pool, "replica": gid}


def _start_ranker(job_file: Path, out_dir: Path, log_dir: Path, admin_port: int) -> tuple[Child, str]:
    """The ranker (light: it shares cores), its state kept in the run directory."""
    endpoint_file = out_dir / "ranker.json"
    endpoint_file.unlink(missing_ok=True)
    ranker = _spawn("ranker", ["ranker", str(job_file), "--state", str(out_dir / "ranker.npz"),
                               "--endpoint-file", str(endpoint_file), "--admin-port", str(admin_port)],
                    1, [], log_dir)
    ranker.endpoint_file, ranker.admin_port = endpoint_file, admin_port
    try:
        return ranker, f"127.0.0.1:{_wait_endpoint(endpoint_file, ranker)['grpc_port']}"
    except BaseException:
        _stop([ranker])
        raise


def start_services(job: RLJob, job_file: Path, model_dir: Path, out_dir: Path,
                   admin_ports: dict[str, int]) -> tuple[Child, list[Child], dict, GeneratorLauncher]:
    """Start every process plan_processes(job) names, each on its admin port from
    `admin_ports`: the ranker when dispatch needs it, the trainer, then every generator
    replica; returns (trainer, the others, the trainer's endpoint, the generator launcher)."""
    spec = job.spec
    planned = plan_processes(job)
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    cores = CorePlanner()
    others: list[Child] = []  # ranker (when needed) and generators
    ranker_args: list[str] = []
    if "ranker" in planned:
        ranker, address = _start_ranker(job_file, out_dir, log_dir, admin_ports["ranker"])
        ranker.labels = planned["ranker"]
        others.append(ranker)
        ranker_args = ["--ranker", address]
    colocated = spec.pipeline.mode == PipelineMode.colocated
    # Colocated alternates generation and training in one process: it gets every core.
    trainer_threads = (len(cores.cores) or 1) if colocated else spec.trainer.threads
    endpoint_file = out_dir / "trainer.json"
    endpoint_file.unlink(missing_ok=True)
    trainer = _spawn("trainer", ["trainer", str(job_file), "--model-dir", str(model_dir), "--out", str(out_dir),
                                 "--threads", str(trainer_threads), "--endpoint-file", str(endpoint_file),
                                 *ranker_args, "--admin-port", str(admin_ports["trainer"])],
                     trainer_threads, cores.take(trainer_threads), log_dir)
    trainer.endpoint_file, trainer.labels = endpoint_file, planned["trainer"]
    trainer.admin_port = admin_ports["trainer"]
    try:
        endpoint = _wait_endpoint(endpoint_file, trainer)
        launcher = GeneratorLauncher(job, job_file, model_dir, out_dir, f"127.0.0.1:{endpoint['grpc_port']}", cores)
        for name, labels in planned.items():
            if labels["role"] == "generator":
                others.append(launcher.start(labels["pool"], admin_ports[name]))
    except BaseException:
        _stop([trainer, *others])
        raise
    return trainer, others, endpoint, launcher


class GeneratorLauncher:
    """Starts generator replicas of a running job: at start-up and when the autoscaler adds
    one. Replica ids are <pool>-<n>, never reused within a run."""

    def __init__(self, job: RLJob, job_file: Path, model_dir: Path, out_dir: Path, trainer: str, cores: CorePlanner):
        self.job, self.job_file, self.model_dir, self.out_dir = job, job_file, model_dir, out_dir
        self.trainer = trainer
        self.cores = cores
        self.pools = {p.name: p for p in job.spec.generators.pools}
        self.started: dict[str, int] = {}
        self.children: list[Child] = []
        """Every replica started in this run (also those that left)."""

    def start(self, pool_name: str, admin_port: int | None = None) -> Child:
        pool = self.pools[pool_name]
        n = self.started[pool_name] = self.started.get(pool_name, 0) + 1
        name, labels = generator_process(pool_name, n - 1)
        gid = labels["replica"]
        admin_port = admin_port or free_port()
        endpoint = self.out_dir / "endpoints" / f"{name}.json"
        endpoint.parent.mkdir(exist_ok=True)
        endpoint.unlink(missing_ok=True)
        child = _spawn(
            name,
            ["generator", str(self.job_file), "--trainer", self.trainer, "--pool", pool.name, "--id", gid,
             "--model-dir", str(self.model_dir), "--admin-port", str(admin_port), "--endpoint-file", str(endpoint),
             "--timeline", str(self.out_dir / "timeline" / f"{name}.jsonl")],
            pool.threads, self.cores.take(pool.threads), self.out_dir / "logs")
        child.endpoint_file, child.admin_port = endpoint, admin_port
        child.labels = labels
        self.children.append(child)
        return child


def scrape_targets(job: RLJob, children: list[Child]) -> list[Target]:
    """The admin endpoints of the children still running, labelled for Prometheus."""
    return [Target(f"127.0.0.1:{c.admin_port}", {"rljob": job.metadata.name, **c.labels})
            for c in children if c.proc.poll() is None and c.admin_port is not None]


def _progress(job: RLJob, trainer: Child, others: list[Child], admin: str, out_dir: Path, quiet: bool,
              on_tick: Callable[[Callable[[str], None]], None] = lambda say: None) -> None:
    """Show progress until the trainer exits; `on_tick(say)` runs every half second."""
    from tqdm import tqdm

    total = job.spec.algorithm.num_iterations
    bar = tqdm(total=total, unit="it", desc=job.metadata.name, disable=quiet, dynamic_ncols=True)
    say = (lambda msg: None) if quiet else bar.write
    shown = 0
    failed: set[str] = set()
    with httpx.Client(timeout=2.0) as http:
        while trainer.proc.poll() is None:
            try:
                st = http.get(f"{admin}/status").json()
            except (httpx.HTTPError, ValueError):
                st = None
            if st:
                done = st["iteration"]
                if done > shown:
                    bar.update(done - shown)
                    shown = done
                last = st.get("last") or {}
                bar.set_postfix(
                    v=st["policy_version"], gens=len(st.get("generators", {})),
                    samples_s=f"{st['samples_per_s']:.0f}",
                    reward=f"{last.get('reward_mean', float('nan')):.3f}",
                    bubble=f"{last.get('pipeline_bubble_ratio', float('nan')):.2f}",
                )
            for g in others:
                if g.name not in failed and g.proc.poll() not in (None, 0):
                    failed.add(g.name)
                    bar.write(f"warning: {g.name} exited with {g.proc.returncode}; see {g.log_path}")
            on_tick(say)
            time.sleep(0.5)
    metrics = out_dir / "metrics.jsonl"
    if metrics.exists():  # iterations finished between the last poll and the exit
        bar.update(len(metrics.read_text().splitlines()) - shown)
    bar.close()


def run(job_file: Path, out_dir: Path | None = None, quiet: bool = False, prometheus: bool = False,
        cores: int | None = None) -> int:
    job = load_job(job_file)
    out_dir = out_dir or Path("runs") / f"{job.metadata.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    say = (lambda *a: None) if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    spec = job.spec
    planner = CorePlanner()
    available = len(planner.cores) or os.cpu_count() or 1
    if cores is not None and cores < 1:
        raise ValueError(f"--cores must be at least 1, got {cores}")
    cores = cores or available
    elastic = spec.autoscaling.mode == "Internal" and spec.pipeline.mode != PipelineMode.colocated
    if spec.autoscaling.mode == "Internal" and not elastic:
        say("autoscaling.mode Internal: colocated mode has no generator replicas to scale; replicas stay as written")
    if spec.autoscaling.mode == "External":
        say("autoscaling.mode External: nothing drives /scale in a local run; replicas stay as written")
    if cores > available:
        say(f"warning: --cores {cores} is more than the {available} this process may run on: processes share cores")
    server = None
    if prometheus or elastic:
        try:
            server = LocalPrometheus(out_dir / "prometheus")  # fails before anything starts
        except FileNotFoundError as err:
            flag = "--prometheus" if prometheus else \
                "spec.autoscaling.mode Internal (local autoscaling reads its inputs from Prometheus)"
            raise ValueError(f"{flag}: {err}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    resolved = out_dir / "job.yaml"
    resolved.write_text(dump_job(job))
    (out_dir / "autoscaling.jsonl").unlink(missing_ok=True)
    say(f"streamrl run {job.metadata.name}: mode {spec.pipeline.mode.value}, model {model_spec_summary(spec.model)}, "
        f"{sum(spec.generators.pool_replicas().values())} generator replica(s)"
        f"{f' (elastic, up to {cores} cores)' if elastic else ''}, out {out_dir}")
    model_dir = resolve_model_dir(spec, log=say)
    # Every process's admin port is chosen up front, so Prometheus scrapes each one from
    # the moment it listens (a counter first seen mid-run loses its start to rate()).
    planned = plan_processes(job)
    admin_ports = {name: free_port() for name in planned}
    scaler_admin = None
    scaler: LocalAutoscaler | None = None  # its /status may be asked before it exists
    scaler_metrics = AutoscalerMetrics()
    if elastic:
        scaler_admin = AdminServer(scaler_metrics.registry, lambda: scaler.summary() if scaler else {},
                                   lambda: True, "127.0.0.1", 0)
        scaler_admin.start()
    extra_targets = [Target(f"127.0.0.1:{scaler_admin.port}", {"role": "autoscaler"})] if scaler_admin else []
    if server is not None:
        server.set_targets([Target(f"127.0.0.1:{admin_ports[name]}", {"rljob": job.metadata.name, **labels})
                            for name, labels in planned.items()] + extra_targets)
        say(f"prometheus: {server.start()} (data in {server.directory})")
    try:
        trainer, others, endpoint, launcher = start_services(job, resolved, model_dir, out_dir, admin_ports)
    except BaseException:
        if server is not None:
            server.stop()
        if scaler_admin is not None:
            scaler_admin.stop()
        raise
    if elastic:
        def drain(child: Child) -> None:
            child.proc.send_signal(signal.SIGTERM)

        def start(pool: str) -> Child:
            child = launcher.start(pool)
            others.append(child)
            return child

        fleet = Fleet(start, drain, [c for c in others if c.labels.get("role") == "generator"])
        prometheus_api = PrometheusAPI(server.url)
        scaler = LocalAutoscaler(job, prometheus_api, fleet, cores, out_dir, say, scaler_metrics)
    scraped: list[Target] = []
    replaced: set[str] = set()

    def tick(bar_say: Callable[[str], None]) -> None:
        nonlocal scraped
        if scaler is not None:
            scaler.say = bar_say
            scaler.tick()
        else:  # as a Deployment would: a crashed replica is replaced (its work is re-dispatched)
            for c in list(others):
                if c.labels.get("role") == "generator" and c.name not in replaced and c.proc.poll() not in (None, 0):
                    replaced.add(c.name)
                    if len(replaced) > MAX_REPLICA_RESTARTS:
                        bar_say(f"{c.name} exited with {c.proc.returncode}; not replaced: "
                                f"{MAX_REPLICA_RESTARTS} replicas already were")
                        continue
                    child = launcher.start(c.labels["pool"])
                    others.append(child)
                    bar_say(f"{c.name} exited with {c.proc.returncode}; started {child.name} in its place")
        if server is not None and (now := scrape_targets(job, [trainer, *others]) + extra_targets) != scraped:
            server.set_targets(now)
            scraped = now

    try:
        _progress(job, trainer, others, f"http://127.0.0.1:{endpoint['admin_port']}", out_dir, quiet, tick)
    except KeyboardInterrupt:
        say("interrupted: stopping services (the trainer writes its summary and model first)")
    finally:
        _stop([trainer])
        _stop(others)
        if server is not None:
            server.stop()
        if scaler_admin is not None:
            scaler_admin.stop()
        if scaler is not None:
            prometheus_api.close()
    code = trainer.proc.returncode
    summary_path = out_dir / "summary.json"
    if summary_path.exists():
        s = json.loads(summary_path.read_text())
        # What only the runner knows: how many replica-seconds generation used, and scaling.
        s["generator_replica_seconds"] = round(sum(c.seconds() for c in launcher.children), 2)
        s["generator_replicas_started"] = len(launcher.children)
        if scaler is not None:
            s["autoscaling"] = scaler.summary()
        summary_path.write_text(json.dumps(s, indent=2) + "\n")
        say(f"done: {s['num_iterations']} iterations, {s['num_samples']} samples, {s['samples_per_s']:.1f} samples/s, "
            f"reward {s.get('reward_first') or 0:.3f} -> {s.get('reward_last') or 0:.3f}, "
            f"pipeline bubble {s['pipeline_bubble_ratio']:.2f}; results in {out_dir}")
    if (out_dir / "metrics.jsonl").exists():
        try:
            from streamrl.report import write_report

            say(f"report: {write_report(out_dir)[-1]}")
        except Exception as err:  # a plot must never cost the run its exit status
            say(f"warning: could not write the run report: {err!r}")
    if code not in (0, 130):
        say(f"trainer failed (exit {code}):\n{_tail(trainer.log_path)}")
    return 0 if code == 0 else code if code else 1
