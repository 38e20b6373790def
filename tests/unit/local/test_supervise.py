"""The restart policy of fixed generators, over real (tiny) processes: a crashed replica is
replaced, a clean exit is not, and restarts stop after MAX_REPLICA_RESTARTS."""

from __future__ import annotations

import subprocess
import sys

from streamrl.local.children import Child
from streamrl.local.supervise import ReplicaRestarts


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
    restarts = ReplicaRestarts(launcher)
    restarts.tick(said.append)
    assert said == ["generator-default-0 exited with -9; started generator-default-1 in its place"]
    restarts.tick(said.append)  # the replacement exited 0 (drained): nothing to do, nothing said twice
    assert len(launcher.children) == 2 and len(said) == 1


def test_restarts_stop_after_the_limit(tmp_path):
    launcher = _FakeLauncher(tmp_path, [1, 1, 1, 1, 1])
    launcher.start("a")
    said: list[str] = []
    restarts = ReplicaRestarts(launcher, max_restarts=3)
    for _ in range(6):
        restarts.tick(said.append)
    assert len(launcher.children) == 4  # the first and its three replacements
    assert said[-1] == "generator-a-3 exited with 1; not replaced: 3 replicas already were"
    assert restarts.crashed == ["generator-a-0", "generator-a-1", "generator-a-2", "generator-a-3"]
