"""The restart policies, over real (tiny) processes and a test's clock: a generator replica
that served and died is replaced at once, every time; one that died before serving is replaced
after its slot's backoff (10 s doubling to 5 min, reset by 10 min of serving), said in the
progress line and events.jsonl; a clean exit is not replaced; the run fails only when no
replica runs and every slot is hopeless. A trainer that failed is restarted, every rank of
it, within its restart limit, and one that finished is not; each death, backoff, replacement
and restart is a line of events.jsonl."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamrl.local import RunFailed
from streamrl.local.children import Child
from streamrl.local.crashloop import BACKOFF_RESET_S, HOPELESS_CRASHES, backoff_s
from streamrl.local.supervise import Deaths, ReplicaRestarts, TrainerRestarts
from streamrl.records import EVENTS_FILE, GeneratorJoin, GeneratorStatus, RunEvent, TrainerPhase, TrainerStatus


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


class _Clock:
    """Seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _FakeLauncher:
    """Starts a real process per replica: each pool's n-th exits at once with its n-th code
    (-N: killed by signal N; past the list, 0) or, for None, runs until the test ends."""

    def __init__(self, tmp_path, codes: dict[str, list[int | None]]):
        self.tmp_path, self.codes = tmp_path, codes
        self.started: dict[str, int] = {}
        self.children: list[Child] = []

    def start(self, pool: str) -> Child:
        n = self.started[pool] = self.started.get(pool, 0) + 1
        code = self.codes[pool][n - 1] if n <= len(self.codes[pool]) else 0
        child = Child(f"generator-{pool}-{n - 1}", _exiting(code), self.tmp_path / f"{pool}-{n - 1}.log",
                      labels={"role": "generator", "pool": pool, "replica": f"{pool}-{n - 1}"})
        self.children.append(child)
        return child

    def close(self) -> None:
        for c in self.children:
            if c.running():
                c.proc.kill()
                c.proc.wait()


@pytest.fixture
def launch(tmp_path):
    """launch({pool: exit codes}) -> a _FakeLauncher with each pool's first replica started."""
    launchers: list[_FakeLauncher] = []

    def make(codes: dict[str, list[int | None]]) -> _FakeLauncher:
        launchers.append(launcher := _FakeLauncher(tmp_path, codes))
        for pool in codes:
            launcher.start(pool)
        return launcher

    yield make
    for launcher in launchers:
        launcher.close()


def _status(served: dict[str, int] | None = None, joined: tuple[str, ...] = ()) -> TrainerStatus:
    """The trainer's /status with connected replicas and their accepted samples, and the joins of this start."""
    return TrainerStatus(
        run_id="r", phase=TrainerPhase.RUNNING, mode="stream-async", iteration=1, num_iterations=9,
        policy_version=1, num_samples_accepted=sum((served or {}).values()), samples_per_s=1.0, uptime_s=5.0,
        generators={gid: GeneratorStatus(pool=gid.rsplit("-", 1)[0], capacity=8, outstanding=0, policy_version=1,
                                         num_samples=n) for gid, n in (served or {}).items()},
        generator_joins=[GeneratorJoin(generator_id=gid, pool=gid.rsplit("-", 1)[0], startup_s=1.0, join_s=2.0)
                         for gid in joined])


def test_a_replica_that_served_is_replaced_at_once_and_a_clean_exit_is_not(tmp_path, launch):
    launcher = launch({"default": [-9, 0]})
    said: list[str] = []
    restarts, deaths = ReplicaRestarts(launcher, tmp_path, _Clock()), Deaths(tmp_path)
    restarts.observe(_status(joined=("default-0",)))  # its first sample accepted, then it died between two polls
    deaths.tick(launcher.children)
    restarts.tick(said.append)
    assert said == ["generator-default-0 exited with -9; started generator-default-1 in its place"]
    deaths.tick(launcher.children)
    restarts.tick(said.append)  # the replacement exited 0 (drained): nothing to do, nothing said twice
    assert len(launcher.children) == 2 and len(said) == 1
    assert _events(tmp_path) == [("died", "generator-default-0"), ("replaced", "generator-default-0")]
    assert RunEvent.read_lines(tmp_path / EVENTS_FILE)[1].detail == "by generator-default-1"


def test_the_same_slot_killed_five_times_within_a_minute_after_serving_is_replaced_at_once_each_time(
        tmp_path, launch):
    launcher = launch({"a": [-9] * 5 + [None]})
    clock, said = _Clock(), []
    restarts = ReplicaRestarts(launcher, tmp_path, clock)
    for n in range(5):
        restarts.observe(_status({f"a-{n}": 3}))  # connected, 3 samples accepted
        clock.now += 10.0  # five kills in 50 s
        restarts.tick(said.append)
        assert len(launcher.children) == n + 2, said  # replaced in the same tick
    assert said[-1] == "generator-a-4 exited with -9; started generator-a-5 in its place"
    assert launcher.children[-1].running() and restarts.slots[0].crashes == 0
    assert [k for k, _ in _events(tmp_path)] == ["replaced"] * 5


def test_replicas_that_die_before_serving_back_off_10_s_doubling_to_5_min(tmp_path, launch):
    # Slot b serves throughout, so slot a keeps trying: 10, 20, 40, 80, 160, 300, 300 s.
    launcher = launch({"a": [1] * 7 + [None], "b": [None]})
    clock, said = _Clock(), []
    restarts = ReplicaRestarts(launcher, tmp_path, clock)
    restarts.observe(_status({"b-0": 5}))
    waits = []
    for n in range(7):
        restarts.tick(said.append)
        assert launcher.started["a"] == n + 1, "no start before the backoff is over"
        wait = float(said[-1].split("next start in ")[1].split(" s")[0])
        assert said[-1].startswith(f"generator a-0 crash-looping: next start in {wait:.0f} s (generator-a-{n} exited "
                                   f"with 1 ")
        waits.append(wait)
        clock.now += wait - 0.5
        restarts.tick(said.append)
        assert launcher.started["a"] == n + 1, f"started {0.5} s early"
        clock.now += 0.5
        restarts.tick(said.append)  # due: started, and it dies at once
        assert launcher.started["a"] == n + 2
        assert said[-1] == f"generator a-0: started generator-a-{n + 1} in place of generator-a-{n} after a " \
                           f"{wait:.0f} s backoff"
    assert waits == [10, 20, 40, 80, 160, 300, 300] == [backoff_s(n) for n in range(1, 8)]
    events = RunEvent.read_lines(tmp_path / EVENTS_FILE)
    assert [(e.kind, e.process) for e in events[:2]] == [("backoff", "generator-a-0"), ("replaced", "generator-a-0")]
    assert events[0].detail.endswith("(1 in a row in slot a-0); next start in 10 s")
    assert events[1].detail == "by generator-a-1 after a 10 s backoff"
    assert launcher.children[-1].running() and launcher.started["b"] == 1


def test_10_min_of_serving_resets_the_backoff_and_less_does_not(tmp_path, launch):
    launcher = launch({"a": [1, 1, None, 1, None, 1, None]})
    clock, said = _Clock(), []
    restarts = ReplicaRestarts(launcher, tmp_path, clock)

    def crash_then_start() -> float:
        restarts.tick(said.append)
        wait = restarts.slots[0].next_start_at - clock.now
        clock.now += wait
        restarts.tick(said.append)
        return wait

    def serve_then_kill(replica: int, serving_s: float) -> None:
        restarts.observe(_status({f"a-{replica}": 1}))
        restarts.tick(said.append)  # seen serving
        clock.now += serving_s
        launcher.children[-1].proc.kill()
        launcher.children[-1].proc.wait()
        restarts.tick(said.append)
        assert said[-1] == f"generator-a-{replica} exited with -9; started generator-a-{replica + 1} in its place"

    assert [crash_then_start(), crash_then_start()] == [10, 20]  # a-0, a-1 died before serving
    serve_then_kill(2, BACKOFF_RESET_S - 1)  # served 9 min 59 s: replaced at once, the count kept
    assert crash_then_start() == 40  # a-3 died before serving: the third in the slot's count
    serve_then_kill(4, BACKOFF_RESET_S)  # served 10 min: replaced at once, the count cleared
    assert crash_then_start() == 10
    assert launcher.children[-1].name == "generator-a-6" and launcher.children[-1].running()


def test_the_run_fails_saying_why_once_no_replica_runs_and_every_slot_is_hopeless(tmp_path, launch):
    launcher = launch({"a": [1] * 10})
    clock, said = _Clock(), []
    restarts = ReplicaRestarts(launcher, tmp_path, clock)
    for _ in range(HOPELESS_CRASHES - 1):  # each crash backs off; none fails the run
        restarts.tick(said.append)
        clock.now = restarts.slots[0].next_start_at
        restarts.tick(said.append)
    with pytest.raises(RunFailed, match=r"^no generator replica is running and every slot is crash-looping, its "
                                        r"replicas dying before the trainer accepted a sample of theirs \(slot a-0: "
                                        r"6 in a row, the last generator-a-5 exited with 1 .*a-5.log\)\): nothing "
                                        r"can generate"):
        restarts.tick(said.append)
    assert launcher.started["a"] == HOPELESS_CRASHES
    assert restarts.crashed == [f"generator-a-{n}" for n in range(HOPELESS_CRASHES)]


def test_a_hopeless_slot_does_not_fail_the_run_while_another_serves(tmp_path, launch):
    launcher = launch({"a": [1] * 10, "b": [None]})
    clock, said = _Clock(), []
    restarts = ReplicaRestarts(launcher, tmp_path, clock)
    for _ in range(HOPELESS_CRASHES + 1):
        restarts.tick(said.append)
        clock.now = restarts.slots[0].next_start_at
        restarts.tick(said.append)
    assert restarts.slots[0].hopeless and launcher.started["a"] == HOPELESS_CRASHES + 2
    assert "next start in 300 s" in said[-2]


class _FakeGroup:
    def __init__(self, ranks: list[Child]):
        self.ranks = ranks


class _FakeServices:
    """A trainer group of real processes; each restart starts the next exit codes given (None: runs)."""

    def __init__(self, tmp_path, starts: list[list[int | None]]):
        self.tmp_path, self.starts = tmp_path, starts
        self.trainer_group = _FakeGroup([])
        self.launcher = _FakeLauncher(tmp_path, {"default": [0]})
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
