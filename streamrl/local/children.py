"""A process a local run started: how it is spawned (one torch thread per core it is
given, pinned to those cores; or forked by the zygote, whose runner-side handle is here),
how long it lived, its log, how it is stopped. Knows nothing of what the process does."""

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

STARTUP_TIMEOUT_S = 180.0
"""How long a process may take to listen (torch import and model load on busy cores)."""
STOP_TIMEOUT_S = 15.0
"""How long a process may take to exit after SIGTERM before it is killed."""
READY_TIMEOUT_S = 180.0
"""How long the zygote may take to import its PRELOAD on busy cores."""


class ForkedProcess:
    """A replica the zygote forked, seen through the part of subprocess.Popen the runner
    uses. Its exit comes from the zygote (its parent); signals go to it directly."""

    def __init__(self, pid: int, argv: list[str]):
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _ended(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            assert timeout is not None  # only a bounded wait times out
            raise subprocess.TimeoutExpired(self.args, timeout)
        assert self.returncode is not None  # set before _exited
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass  # it exited a moment ago

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The runner's handle: start the zygote early (its imports overlap the run's start-up),
    then spawn replicas through it."""

    def __init__(self, log_path: Path, env: dict[str, str]):
        self._log = log_path.open("w")
        self._proc = subprocess.Popen([sys.executable, "-m", "streamrl.local.zygote"], env=env, text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                      start_new_session=True)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._answers: list[str] = []
        self._answered = threading.Condition()
        self._replicas: dict[int, ForkedProcess] = {}
        self._exited: dict[int, int] = {}
        """Exits reported before the replica was handed out (it failed at once)."""
        threading.Thread(target=self._read, name="zygote", daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None  # a PIPE (and stdin below)
        for line in self._proc.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "ready":
                self._ready.set()
            elif word == "exited":
                pid, code = map(int, rest.split())
                with self._answered:
                    replica = self._replicas.pop(pid, None)
                    if replica is None:
                        self._exited[pid] = code
                if replica is not None:
                    replica._ended(code)
            else:
                with self._answered:
                    self._answers.append(line.strip())
                    self._answered.notify_all()
        with self._answered:  # the zygote is gone: so is every replica it still had
            self._answers.append("failed the zygote exited")
            self._answered.notify_all()
            for replica in self._replicas.values():
                replica._ended(-signal.SIGKILL)

    def spawn(self, argv: list[str], env: dict[str, str], log_path: Path) -> ForkedProcess:
        """Fork a replica running `streamrl <argv>`; RuntimeError when the zygote cannot."""
        if not self._ready.wait(READY_TIMEOUT_S):
            raise RuntimeError(f"the replica zygote did not finish its imports within {READY_TIMEOUT_S:.0f} s; "
                               f"see {self._log.name}")
        assert self._proc.stdin is not None
        with self._lock:  # one request at a time: its answer is the next line
            with self._answered:
                self._proc.stdin.write(json.dumps({"argv": argv, "env": env, "log": str(log_path)}) + "\n")
                self._proc.stdin.flush()
                while not self._answers:
                    self._answered.wait()
                answer = self._answers.pop(0)
                word, _, rest = answer.partition(" ")
                if word != "started":
                    raise RuntimeError(f"the replica zygote could not fork: {rest}")
                pid = int(rest)
                replica = ForkedProcess(pid, argv)
                if pid in self._exited:
                    replica._ended(self._exited.pop(pid))
                else:
                    self._replicas[pid] = replica
        return replica

    def close(self, timeout_s: float = 5.0) -> None:
        """End the zygote (its replicas were stopped by the runner before)."""
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._log.close()


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
