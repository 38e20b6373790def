"""A pre-imported parent for a local run's generator replicas. A replica's time to join on
busy cores is mostly its imports (torch, transformers, the generator: seconds); the zygote
imports them once, then forks each replica (milliseconds). It loads no model, holds no core
and only waits to fork. Local runs only: a pod starts from its image.

The zygote is a process of its own (`python -m streamrl.local.zygote`), single-threaded so
that forking is safe. It reads one JSON request per line on stdin ({argv, env, log}), forks,
and writes `started <pid>` or `failed <reason>` per request and `exited <pid> <code>` when a
replica it forked ends (a replica is the zygote's child, so only the zygote can reap it).
The runner's side (Zygote, ForkedProcess) is streamrl.local.children: this module is only
the zygote's program, so nothing the runner imports reaches back to streamrl.cli.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import sys
from typing import cast

PRELOAD = ("torch", "transformers", "streamrl.cli", "streamrl.generator.main", "streamrl.generator.torch_engine",
           "transformers.models.llama.modeling_llama")
"""What a replica would import first thing; the zygote imports it once."""


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
        cast(io.TextIOWrapper, stream).reconfigure(line_buffering=True)  # what sys gives a process
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


if __name__ == "__main__":
    serve()
