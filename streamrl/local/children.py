"""A process a local run started: how it is spawned (one torch thread per core it is
given, pinned to those cores), how long it lived, its log, how it is stopped. Knows
nothing of what the process does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from streamrl.local import RunFailed
from streamrl.local.zygote import ForkedProcess, Zygote

STARTUP_TIMEOUT_S = 180.0
"""How long a process may take to listen (torch import and model load on busy cores)."""
STOP_TIMEOUT_S = 15.0
"""How long a process may take to exit after SIGTERM before it is killed."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen | ForkedProcess
    log_path: Path
    endpoint_file: Path | None = None
    """Where it writes {admin_port, ...} once listening."""
    admin_port: int | None = None
    """Its admin port, chosen for it in advance (so it is scraped from the start)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Its role (and pool and replica), as Prometheus labels."""
    started: float = field(default_factory=time.monotonic)
    """When it was started (monotonic seconds)."""
    ended: float | None = None
    """When it exited, as its reaper saw it (replica-seconds count start to end)."""

    def __post_init__(self) -> None:
        threading.Thread(target=self._reap, name=f"reap-{self.name}", daemon=True).start()

    def _reap(self) -> None:
        """Wait for the exit in the background, so its time is when it happened, not when
        someone next looked (a drained replica no longer counts until the run ends)."""
        self.proc.wait()
        self.ended = time.monotonic()

    @property
    def role(self) -> str:
        return self.labels.get("role", "")

    @property
    def pool(self) -> str:
        return self.labels.get("pool", "")

    def running(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Its exit status (None: it runs, or its exit was not seen yet)."""
        return self.proc.returncode

    def seconds(self) -> float:
        """Seconds it lived (so far, while it runs)."""
        return (self.ended or time.monotonic()) - self.started

    def tail(self, n: int = 20) -> str:
        """The last `n` lines of its log."""
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-n:])
        except OSError:
            return ""

    def wait_listening(self, timeout_s: float = STARTUP_TIMEOUT_S) -> dict:
        """Wait for its endpoint file; returns what it wrote there ({grpc_port, admin_port, ...})."""
        assert self.endpoint_file is not None, f"{self.name} was started without an endpoint file"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.endpoint_file.exists():
                return json.loads(self.endpoint_file.read_text())
            if not self.running():
                raise RunFailed(f"{self.name} exited with {self.proc.returncode} before listening:\n{self.tail()}")
            time.sleep(0.1)
        raise RunFailed(f"{self.name} did not start listening within {timeout_s:.0f} s; see {self.log_path}")


def spawn(name: str, argv: list[str], threads: int, cores: list[int], log_dir: Path,
          zygote: Zygote | None = None, env: dict[str, str] | None = None, log_mode: str = "w") -> Child:
    """Start `streamrl <argv>` with `threads` torch threads, pinned to `cores` (none: unpinned),
    in its own session (a Ctrl-C reaches the runner, which stops it in order); forked from
    `zygote` when given (its imports are done: it starts in milliseconds). Its log is
    <log_dir>/<name>.log, appended to with `log_mode` "a" (a restart after its predecessor).
    MKL reads its default thread count once, at start: 1, so that only the process's compute
    thread, which the command gives its threads, runs MKL's products on more than one
    (streamrl.compute)."""
    overrides = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                 "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    log_path = log_dir / f"{name}.log"
    if zygote is not None:
        proc = zygote.spawn([*argv], overrides, log_path)
    else:
        with log_path.open(log_mode) as log:
            proc = subprocess.Popen([sys.executable, "-m", "streamrl.cli", *argv], env=dict(os.environ, **overrides),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
    if cores:
        try:
            os.sched_setaffinity(proc.pid, cores)
        except OSError:
            pass  # it exited already, or the platform cannot pin: it runs unpinned
    return Child(name, proc, log_path)


def stop(children: list[Child], timeout_s: float = STOP_TIMEOUT_S, sig: int = signal.SIGTERM) -> None:
    """Signal each one still running (SIGTERM, or SIGINT for an interrupted run's trainer),
    then wait; kill any still there after `timeout_s`."""
    for c in children:
        if c.proc.poll() is None:
            c.proc.send_signal(sig)
    deadline = time.monotonic() + timeout_s
    for c in children:
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()
