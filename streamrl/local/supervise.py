"""The restart policy of a local run's fixed generators: a replica that crashed is replaced,
as a Deployment would replace its pod (its work is re-dispatched by the trainer), up to
MAX_REPLICA_RESTARTS in a run. A replica that exits 0 (drained, or the run ended) is not
replaced. Elastic runs leave their replicas to the autoscaler."""

from __future__ import annotations

from collections.abc import Callable

from streamrl.local.launch import GeneratorLauncher

MAX_REPLICA_RESTARTS = 3
"""Crashed generator replicas a local run replaces before it carries on without them."""


class ReplicaRestarts:
    """Each tick, replaces the replicas that crashed since the last, while restarts are left."""

    def __init__(self, launcher: GeneratorLauncher, max_restarts: int = MAX_REPLICA_RESTARTS):
        self.launcher = launcher
        self.max_restarts = max_restarts
        self.crashed: list[str] = []
        """Names of the replicas seen crashed, in order (replaced or not)."""

    def tick(self, say: Callable[[str], None]) -> None:
        """Replace every replica that crashed since the last tick, while restarts are left."""
        seen = set(self.crashed)
        for child in list(self.launcher.children):
            if child.name in seen or child.running() or child.proc.returncode == 0:
                continue
            self.crashed.append(child.name)
            if len(self.crashed) > self.max_restarts:
                say(f"{child.name} exited with {child.proc.returncode}; not replaced: "
                    f"{self.max_restarts} replicas already were")
                continue
            replacement = self.launcher.start(child.pool)
            say(f"{child.name} exited with {child.proc.returncode}; started {replacement.name} in its place")
