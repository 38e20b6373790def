"""A pre-imported parent for a local run's generator replicas. A replica's time to join on
busy cores is mostly its imports (torch, transformers, the generator: seconds); the zygote
imports them once, then forks each replica (milliseconds). It loads no model, holds no core
and only waits to fork. Local runs only: a pod starts from its image.

The zygote is a process of its own (`python -m streamrl.local.zygote`), single-threaded so
that forking is safe. It reads one JSON request per line on stdin ({argv, env, log}), forks,
and writes `started <pid>` or `failed <reason>` per request and `exited <pid> <code>` when a
replica it forked ends (a replica is the zygote's child, so only the zygote can reap it).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

PRELOAD = ("torch", "transformers", "streamrl.cli", "streamrl.generator.main", "streamrl.generator.torch_engine",
           "transformers.models.llama.modeling_llama")
"""What a replica would import first thing; the zygote imports it once."""
READY_TIMEOUT_S = 180.0
"""How long the zygote may take to import PRELOAD on busy cores."""


# ---- the zygote process -----------------------------------------------------------------

def _replica(argv: list[str], env: dict[str, str], log_path: str) -> int:
    """In the forked child: its own session, environment and log, then `streamrl <argv>`."""
    import setproctitle

    # What `ps` and `pkill -f` show: the command it would have been started with.
    setproctitle.setproctitle(" ".join([sys.executable, "-m", "streamrl.cli", *argv]))
    os.setsid()  # like start_new_session: a Ctrl-C reaches the runner, which stops it in order
    os.environ.update(env)
    devnull = os.open(os.devnull, os.O_RDONLY)  # not the runner's pipe to the zygote
    os.dup2(devnull, 0)
    os.close(devnull)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from streamrl.cli import main

    return main(argv)


def _fork(request: dict) -> int:
    pid = os.fork()
    if pid == 0:  # the replica
        code = 1
        try:
            code = _replica(request["argv"], request["env"], request["log"])
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
        except BaseException:  # noqa: BLE001 - printed to its log; the exit code says it failed
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def serve() -> None:
    """The zygote's loop: fork on request, report exits; ends when the runner's pipe closes."""
    for name in PRELOAD:
        __import__(name)
    print("ready", flush=True)
    children: set[int] = set()
    stdin = sys.stdin.buffer
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.05)
        if readable:
            line = stdin.readline()
            if not line:
                break  # the runner is gone: its replicas are stopped by it (or their own session)
            try:
                pid = _fork(json.loads(line))
            except (OSError, ValueError, KeyError) as err:
                print(f"failed {err!r}", flush=True)
            else:
                children.add(pid)
                print(f"started {pid}", flush=True)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                print(f"exited {pid} {os.waitstatus_to_exitcode(status)}", flush=True)


# ---- the runner's side ----------------------------------------------------------------------

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
            raise subprocess.TimeoutExpired(self.args, timeout)
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
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._log.close()


if __name__ == "__main__":
    serve()
