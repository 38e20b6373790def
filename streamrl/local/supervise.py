"""The restart policies of a local run, as Kubernetes would apply them: a trainer that failed
is restarted as its Job would restart it (every rank, within trainer.restartLimit, the same
command line and ports: it resumes from its newest checkpoint and its generators reconnect);
a fixed generator replica that crashed is replaced as a Deployment would replace its pod (its
work is re-dispatched by the trainer): at once when it had served, after a kubelet-style
backoff when it died before serving (crashloop.py). A replica that exits 0 (drained, or the
run ended) is not replaced; elastic runs leave their replicas to the autoscaler. Every death,
backoff, restart and replacement is a line of <out>/events.jsonl."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from streamrl.local import RunFailed
from streamrl.local.children import Child
from streamrl.local.crashloop import Slot
from streamrl.local.launch import GeneratorLauncher, Services
from streamrl.records import RunEvent, TrainerStatus, append_event
from streamrl.service import ExitCode

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
    process and its exit code, once trainer.restartLimit restarts are spent, or at once when it
    exited with ExitCode.JOB_ERROR (a failure of the job's own that every start repeats)."""

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
        if code == ExitCode.JOB_ERROR:
            raise RunFailed(f"{who} exited with {code}: the job's own code or files failed in a way every start "
                            f"repeats; not restarted; see {child.log_path}:\n{child.tail()}")
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
    """Each tick, notes the replicas that served (`observe`: the trainer accepted a sample of
    theirs) and replaces the fixed replicas that died with an error since the last tick, in
    their slot: at once when the one that died had served; after its slot's backoff
    (crashloop.py: 10 s doubling to 5 min) when it died before serving, said in the progress
    line and as a `backoff` event before the `replaced` one.

    The run fails only when it cannot make progress: no replica runs and every slot waiting for
    a start is hopeless (HOPELESS_CRASHES replicas in a row died before serving). Nothing will
    generate the samples the trainer waits for, and a slot that failed six starts over five
    minutes of waits is a bad engine, model or image that another 5 min per try would not mend;
    the error names each slot's last replica and shows its log. While one slot's replica runs,
    a hopeless slot goes on trying every 5 min, as a Deployment would."""

    def __init__(self, launcher: GeneratorLauncher, out_dir: Path | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.launcher = launcher
        self.out_dir = out_dir
        """Where events.jsonl is written (None: nowhere)."""
        self.clock = clock
        """Seconds, for the backoff (monotonic; a test's own clock)."""
        self.slots: list[Slot] = []
        """One per fixed replica the run started with (and any other started beside them)."""
        self.slot_of: dict[str, Slot] = {}
        """Replica process name -> its slot (a replacement takes its predecessor's)."""
        self.served: set[str] = set()
        """Ids of the replicas the trainer was seen accepting a sample from (ids are never reused)."""
        self.crashed: list[str] = []
        """Names of the replicas seen exit with an error, in order."""
        self._waiting: dict[str, tuple[Child, float]] = {}
        """Slot name -> the replica that died and the backoff its successor waits."""

    def observe(self, status: TrainerStatus | None) -> None:
        """Note the replicas that served as the trainer's /status tells (None: it did not answer):
        those connected with an accepted sample, and every one whose first sample this start of
        the trainer accepted (also those gone since: one may serve and die between two polls)."""
        if status is not None:
            self.served.update(gid for gid, g in status.generators.items() if g.num_samples > 0)
            self.served.update(j.generator_id for j in status.generator_joins)

    def tick(self, say: Callable[[str], None]) -> None:
        """Replace the replicas that died with an error (at once, or once their slot's backoff is
        over); RunFailed when the run cannot make progress (see the class)."""
        now = self.clock()
        children = list(self.launcher.children)
        for child in children:
            if child.name not in self.slot_of:
                self.slots.append(slot := Slot(child.labels.get("replica", child.name), child.pool))
                self.slot_of[child.name] = slot
            slot = self.slot_of[child.name]
            if child.name not in self.crashed and child.labels.get("replica") in self.served:
                slot.served(now)
        for child in children:
            if child.name in self.crashed or child.running() or child.proc.returncode == 0:
                continue
            self.crashed.append(child.name)
            slot, code = self.slot_of[child.name], child.proc.returncode
            wait = slot.died(now)
            if wait == 0:
                replacement = self._start(slot)
                _event(self.out_dir, "replaced", child.name, f"by {replacement.name}")
                say(f"{child.name} exited with {code}; started {replacement.name} in its place")
                continue
            self._waiting[slot.name] = child, wait
            _event(self.out_dir, "backoff", child.name,
                   f"crash-looping: died {child.seconds():.0f} s after its start, before it served ({slot.crashes} "
                   f"in a row in slot {slot.name}); next start in {wait:.0f} s")
            say(f"generator {slot.name} crash-looping: next start in {wait:.0f} s ({child.name} exited with {code} "
                f"{child.seconds():.0f} s after it started, before it served; {slot.crashes} in a row; see "
                f"{child.log_path})")
        self._fail_if_stuck()
        for slot in self.slots:
            if slot.due(now):
                dead, wait = self._waiting.pop(slot.name)
                replacement = self._start(slot)
                _event(self.out_dir, "replaced", dead.name, f"by {replacement.name} after a {wait:.0f} s backoff")
                say(f"generator {slot.name}: started {replacement.name} in place of {dead.name} after a "
                    f"{wait:.0f} s backoff")

    def _start(self, slot: Slot) -> Child:
        slot.next_start_at = None
        replacement = self.launcher.start(slot.pool)
        self.slot_of[replacement.name] = slot
        return replacement

    def _fail_if_stuck(self) -> None:
        """RunFailed when no replica runs and every slot waiting for a start is hopeless."""
        waiting = [s for s in self.slots if s.next_start_at is not None]
        if not waiting or any(c.running() for c in self.launcher.children) or not all(s.hopeless for s in waiting):
            return
        last = [self._waiting[s.name][0] for s in waiting]
        slots = "; ".join(f"slot {s.name}: {s.crashes} in a row, the last {c.name} exited with {c.proc.returncode} "
                          f"{c.seconds():.0f} s after it started (see {c.log_path})" for s, c in zip(waiting, last))
        raise RunFailed(f"no generator replica is running and every slot is crash-looping, its replicas dying before "
                        f"the trainer accepted a sample of theirs ({slots}): nothing can generate the samples the "
                        f"trainer waits for (a bad engine, model or image?); {last[-1].name}'s log ends:\n"
                        f"{last[-1].tail()}")
