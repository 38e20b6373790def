"""The restart policies, over real (tiny) processes: a crashed generator replica is
replaced, a clean exit is not, and restarts stop after MAX_REPLICA_RESTARTS; a trainer that
failed is restarted, every rank of it, within its restart limit, and one that finished is
not; each death, replacement and restart is a line of events.jsonl."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamrl.local import RunFailed
from streamrl.local.children import Child
from streamrl.local.supervise import Deaths, ReplicaRestarts, TrainerRestarts
from streamrl.records import EVENTS_FILE, RunEvent


def _exiting(code: int | None) -> subprocess.Popen:
    """A process that exits with `code` at once (-N: killed by signal N), or runs on (None)."""
    body = ("import time; time.sleep(60)" if code is None else f"import os; os.kill(os.getpid(), {-code})"
            if code < 0 else f"raise SystemExit({code})")
    proc = subprocess.Popen([sys.executable, "-c", body])
    if code is not None:
        proc.wait()
    return proc


def _events(tmp_path) -> list[tuple[str, str]]:
    path = tmp_path / EVENTS_FILE
    return [(e.kind, e.process) for e in RunEvent.read_lines(path)] if path.exists() else []


class _FakeLauncher:
    """Starts a real process per replica that exits at once with the code it is told (-N: killed by signal N)."""

    def __init__(self, tmp_path, exit_codes: list[int]):
        self.tmp_path, self.exit_codes = tmp_path, exit_codes
        self.children: list[Child] = []

    def start(self, pool: str) -> Child:
        n = len(self.children)
        code = self.exit_codes[n] if n < len(self.exit_codes) else 0
        body = f"import os; os.kill(os.getpid(), {-code})" if code < 0 else f"raise SystemExit({code})"
        proc = subprocess.Popen([sys.executable, "-c", body])
        proc.wait()
        child = Child(f"generator-{pool}-{n}", proc, self.tmp_path / f"{n}.log",
                      labels={"role": "generator", "pool": pool, "replica": f"{pool}-{n}"})
        self.children.append(child)
        return child


def test_a_crashed_replica_is_replaced_and_a_clean_exit_is_not(tmp_path):
    launcher = _FakeLauncher(tmp_path, [-9, 0])
    launcher.start("default")
    said: list[str] = []
    restarts, deaths = ReplicaRestarts(launcher, out_dir=tmp_path), Deaths(tmp_path)
    deaths.tick(launcher.children)
    restarts.tick(said.append)
    assert said == ["generator-default-0 exited with -9; started generator-default-1 in its place"]
    deaths.tick(launcher.children)
    restarts.tick(said.append)  # the replacement exited 0 (drained): nothing to do, nothing said twice
    assert len(launcher.children) == 2 and len(said) == 1
    assert _events(tmp_path) == [("died", "generator-default-0"), ("replaced", "generator-default-0")]
    assert RunEvent.read_lines(tmp_path / EVENTS_FILE)[1].detail == "by generator-default-1"


def test_a_crash_loop_stops_being_replaced_and_the_run_fails_with_no_replica_left(tmp_path):
    launcher = _FakeLauncher(tmp_path, [1, 1, 1, 1, 1])
    launcher.start("a")
    said: list[str] = []
    restarts = ReplicaRestarts(launcher, max_restarts=3)
    for _ in range(3):
        restarts.tick(said.append)
    with pytest.raises(RunFailed, match=r"no generator replica is left running \(the last, generator-a-3, exited "
                                        r"with 1; see .*3.log\)"):
        restarts.tick(said.append)
    assert len(launcher.children) == 4  # the first and its three replacements
    assert said[-1].startswith("generator-a-3 exited with 1 0 s after it started, before it was serving; not "
                               "replaced: 3 replicas already crashed so (a crash loop; see ")
    assert restarts.crashed == ["generator-a-0", "generator-a-1", "generator-a-2", "generator-a-3"]


def _listening(launcher, tmp_path) -> None:
    """Every replica wrote its endpoint file (as each does once listening)."""
    for child in launcher.children:
        child.endpoint_file = tmp_path / f"{child.name}.json"
        child.endpoint_file.write_text("{}")


@pytest.mark.parametrize("endpoint_file", [True, False])
def test_a_replica_that_was_serving_is_always_replaced(tmp_path, endpoint_file):
    launcher = _FakeLauncher(tmp_path, [-9] * 8 + [0])
    launcher.start("a")
    said: list[str] = []
    restarts = ReplicaRestarts(launcher, max_restarts=3, crash_loop_s=0.0)  # each lived long enough
    for _ in range(9):
        if endpoint_file:
            _listening(launcher, tmp_path)
        restarts.tick(said.append)
    assert len(launcher.children) == 9 and restarts.quick_crashes == 0  # eight kills, eight replacements
    assert said[-1] == "generator-a-7 exited with -9; started generator-a-8 in its place"


def test_replicas_that_crash_soon_after_they_listen_are_a_crash_loop_too(tmp_path):
    launcher = _FakeLauncher(tmp_path, [1] * 8)
    launcher.start("a")
    said: list[str] = []
    restarts = ReplicaRestarts(launcher, max_restarts=3, crash_loop_s=30.0)
    with pytest.raises(RunFailed, match="no generator replica is left running"):
        for _ in range(8):
            _listening(launcher, tmp_path)  # listening, then dead on its first weights or batch
            restarts.tick(said.append)
    assert len(launcher.children) == 4 and restarts.quick_crashes == 4


class _FakeGroup:
    def __init__(self, ranks: list[Child]):
        self.ranks = ranks


class _FakeServices:
    """A trainer group of real processes; each restart starts the next exit codes given (None: runs)."""

    def __init__(self, tmp_path, starts: list[list[int | None]]):
        self.tmp_path, self.starts = tmp_path, starts
        self.trainer_group = _FakeGroup([])
        self.launcher = _FakeLauncher(tmp_path, [0])
        self.launcher.start("default")  # a generator: it reconnects, the message says
        self.restarted = 0
        self._start()

    def _start(self) -> None:
        codes = self.starts[min(self.restarted, len(self.starts) - 1)]
        self.trainer_group.ranks = [
            Child("trainer" if r == 0 else f"trainer-rank-{r}", _exiting(code), self.tmp_path / f"t{r}.log",
                  labels={"role": "trainer", **({"rank": str(r)} if r else {})})
            for r, code in enumerate(codes)]

    @property
    def trainer(self) -> Child:
        return self.trainer_group.ranks[0]

    @property
    def trainer_ranks(self) -> list[Child]:
        return self.trainer_group.ranks[1:]

    def restart_trainer(self) -> Child:
        for c in self.trainer_group.ranks:
            if c.running():
                c.proc.kill()
                c.proc.wait()
        self.restarted += 1
        self._start()
        return self.trainer

    def close(self) -> None:
        for c in self.trainer_group.ranks:
            if c.running():
                c.proc.kill()
                c.proc.wait()


def test_a_killed_trainer_is_restarted_with_its_events_and_one_that_finished_is_not(tmp_path):
    services = _FakeServices(tmp_path, [[-9], [None]])
    said: list[str] = []
    restarts = TrainerRestarts(services, None, tmp_path)
    try:
        restarts.tick(said.append)
        assert said == ["trainer exited with -9; restarting it (restart 1 of 3); its generators reconnect"]
        assert services.restarted == 1 and services.trainer.running() and restarts.restarts == 1
        restarts.tick(said.append)  # the new start runs: nothing to do
        assert len(said) == 1
        assert _events(tmp_path) == [("died", "trainer"), ("restarted", "trainer")]
        assert RunEvent.read_lines(tmp_path / EVENTS_FILE)[0].detail == "exit -9"
    finally:
        services.close()
    for code in (0, 130):  # Succeeded or Preempted; Interrupted: the run is over
        done = _FakeServices(tmp_path, [[code]])
        TrainerRestarts(done, None, tmp_path).tick(said.append)
        assert done.restarted == 0 and len(said) == 1


def test_a_rank_that_dies_restarts_the_whole_group(tmp_path):
    services = _FakeServices(tmp_path, [[None, -9], [None, None]])
    said: list[str] = []
    try:
        TrainerRestarts(services, 2, tmp_path).tick(said.append)
        assert said == ["trainer rank 1 (trainer-rank-1) exited with -9; restarting all 2 of its ranks (restart 1 "
                        "of 2); its generators reconnect"]
        assert services.restarted == 1 and all(c.running() for c in services.trainer_group.ranks)
        assert _events(tmp_path) == [("died", "trainer-rank-1"), ("restarted", "trainer")]
    finally:
        services.close()


def test_a_rank_that_exits_0_while_rank_0_finishes_is_no_failure(tmp_path):
    services = _FakeServices(tmp_path, [[None, 0]])
    try:
        TrainerRestarts(services, None, tmp_path).tick(lambda msg: pytest.fail(msg))
        assert services.restarted == 0
    finally:
        services.close()


def test_the_run_fails_naming_the_trainer_and_its_exit_code_once_the_restart_limit_is_spent(tmp_path):
    services = _FakeServices(tmp_path, [[1]])
    said: list[str] = []
    restarts = TrainerRestarts(services, 1, tmp_path)
    restarts.tick(said.append)
    assert services.restarted == 1
    with pytest.raises(RunFailed, match=r"^trainer exited with 1; not restarted: 1 restart\(s\) of "
                                        r"trainer.restartLimit 1 spent"):
        restarts.tick(said.append)
    assert services.restarted == 1 and len(said) == 1
    assert _events(tmp_path) == [("died", "trainer"), ("restarted", "trainer"), ("died", "trainer")]
    with pytest.raises(RunFailed, match="restartLimit 0"):  # 0: a failed trainer fails the run at once
        TrainerRestarts(_FakeServices(tmp_path, [[-9]]), 0, None).tick(said.append)
