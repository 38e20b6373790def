"""The restart policies of a local run, as Kubernetes would apply them: a trainer that failed
is restarted as its Job would restart it (every rank, within trainer.restartLimit, the same
command line and ports: it resumes from its newest checkpoint and its generators reconnect);
a fixed generator replica that crashed is replaced as a Deployment would replace its pod (its
work is re-dispatched by the trainer), up to MAX_REPLICA_RESTARTS in a run. A replica that
exits 0 (drained, or the run ended) is not replaced; elastic runs leave their replicas to the
autoscaler. Every death, restart and replacement is a line of <out>/events.jsonl."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from streamrl.local import RunFailed
from streamrl.local.children import Child
from streamrl.local.launch import GeneratorLauncher, Services
from streamrl.records import RunEvent, append_event

MAX_REPLICA_RESTARTS = 3
"""Replicas that crash before they start serving (a crash loop: a bad engine, a bad model) a
local run replaces before it stops replacing them; a replica that was serving is always
replaced, as a Deployment would replace its pod."""
CRASH_LOOP_S = 30.0
"""A replica that dies within this many seconds of its start counts toward the crash loop,
even when it had written its endpoint file: one that crashes once listening, on its first
weights or first batch, would otherwise be replaced without end."""
TRAINER_RESTART_LIMIT = 3
"""Trainer restarts of `streamrl run` when spec.trainer.restartLimit is unset."""
FINISHED = (0, 130)
"""Trainer exit codes that end the run rather than restart it: done (Succeeded, or Preempted:
the runner asked it to stop) and Interrupted."""


def _event(out_dir: Path | None, kind: str, process: str, detail: str = "") -> None:
    if out_dir is not None:
        append_event(out_dir, RunEvent(time_unix=round(time.time(), 3), kind=kind, process=process, detail=detail))


class TrainerRestarts:
    """Each tick, restarts the trainer's whole group when a rank failed: rank 0 exiting with
    anything but FINISHED, or another rank exiting non-zero while rank 0 runs (rank 0 would
    wait in a collective for it until the process group's timeout). RunFailed, naming the
    process and its exit code, once trainer.restartLimit restarts are spent."""

    def __init__(self, services: Services, restart_limit: int | None, out_dir: Path | None = None):
        self.services = services
        self.limit = TRAINER_RESTART_LIMIT if restart_limit is None else restart_limit
        self.out_dir = out_dir
        self.restarts = 0

    def _failed(self) -> tuple[Child, int] | None:
        """The rank whose exit fails the group, and its exit code; None while it is sound."""
        leader = self.services.trainer
        code = leader.proc.poll()
        if code is not None:
            return None if code in FINISHED else (leader, code)
        for child in self.services.trainer_ranks:
            code = child.proc.poll()
            if code not in (None, 0):
                return child, code
        return None

    def tick(self, say: Callable[[str], None]) -> None:
        failed = self._failed()
        if failed is None:
            return
        child, code = failed
        rank = child.labels.get("rank")
        who = f"trainer rank {rank} ({child.name})" if rank else "trainer"
        _event(self.out_dir, "died", child.name, f"exit {code}")
        if self.restarts >= self.limit:
            raise RunFailed(f"{who} exited with {code}; not restarted: {self.restarts} restart(s) of "
                            f"trainer.restartLimit {self.limit} spent; see {child.log_path}:\n{child.tail()}")
        self.restarts += 1
        ranks = len(self.services.trainer_group.ranks)
        what = "it" if ranks == 1 else f"all {ranks} of its ranks"
        gens = "; its generators reconnect" if self.services.launcher.children else ""  # none when colocated
        say(f"{who} exited with {code}; restarting {what} (restart {self.restarts} of {self.limit}){gens}")
        self.services.restart_trainer()
        _event(self.out_dir, "restarted", "trainer", f"restart {self.restarts} of {self.limit} after {child.name} "
                                                     f"exited with {code}")


class Deaths:
    """Each tick, a `died` event for every process other than the trainer's ranks (those are
    TrainerRestarts') that exited non-zero since the last: generators, fixed or elastic, and
    the ranker."""

    def __init__(self, out_dir: Path | None):
        self.out_dir = out_dir
        self.seen: set[str] = set()

    def tick(self, children: list[Child]) -> None:
        for child in children:
            if child.name in self.seen or child.role == "trainer" or child.running() or child.proc.returncode == 0:
                continue
            self.seen.add(child.name)
            _event(self.out_dir, "died", child.name, f"exit {child.proc.returncode}")


class ReplicaRestarts:
    """Each tick, replaces the replicas that crashed since the last: always, unless
    `max_restarts` replicas already crashed before they were serving (a crash loop: replacing
    more would only repeat it). With none left running and none replaced, the run
    fails, saying so, rather than wait for samples nobody will send."""

    def __init__(self, launcher: GeneratorLauncher, max_restarts: int = MAX_REPLICA_RESTARTS,
                 out_dir: Path | None = None, crash_loop_s: float = CRASH_LOOP_S):
        self.launcher = launcher
        self.max_restarts = max_restarts
        self.crash_loop_s = crash_loop_s
        self.quick_crashes = 0
        """Replicas that died within crash_loop_s of their start."""
        self.out_dir = out_dir
        """Where events.jsonl is written (None: nowhere)."""
        self.crashed: list[str] = []
        """Names of the replicas seen crashed, in order (replaced or not)."""

    def _was_serving(self, child: Child) -> bool:
        """It had lived crash_loop_s and, where it has one, written its endpoint file
        (listening, engine loaded)."""
        listening = child.endpoint_file is None or child.endpoint_file.exists()
        return listening and child.seconds() >= self.crash_loop_s

    def tick(self, say: Callable[[str], None]) -> None:
        """Replace every replica that crashed since the last tick, unless they crash-loop."""
        seen = set(self.crashed)
        declined = None
        for child in list(self.launcher.children):
            if child.name in seen or child.running() or child.proc.returncode == 0:
                continue
            self.crashed.append(child.name)
            code = child.proc.returncode
            if not self._was_serving(child):
                self.quick_crashes += 1
                if self.quick_crashes > self.max_restarts:
                    say(f"{child.name} exited with {code} {child.seconds():.0f} s after it started, before it was "
                        f"serving; not replaced: {self.max_restarts} replicas already crashed so (a crash loop; "
                        f"see {child.log_path})")
                    declined = child
                    continue
            replacement = self.launcher.start(child.pool)
            _event(self.out_dir, "replaced", child.name, f"by {replacement.name}")
            say(f"{child.name} exited with {code}; started {replacement.name} in its place")
        if declined is not None and not any(c.running() for c in self.launcher.children):
            raise RunFailed(f"no generator replica is left running (the last, {declined.name}, exited with "
                            f"{declined.proc.returncode}; see {declined.log_path}): nothing can generate the samples "
                            "the trainer waits for")
