"""When a fixed generator slot of a local run may start its next replica, as the kubelet
backs off a container that keeps dying: a replica that served (the trainer accepted a sample
of it) and then died is replaced at once; one that died before it served waits 10 s, then
20, 40 ... up to 5 min, and a replica that serves 10 min resets the wait. Pure: it knows
times (an injected clock's seconds) and outcomes, no processes."""

from __future__ import annotations

from dataclasses import dataclass

BACKOFF_INITIAL_S = 10.0
"""The wait before the replacement of a slot's first replica in a row to die before serving."""
BACKOFF_MAX_S = 300.0
"""The cap of the doubling wait (the kubelet's 5 min)."""
BACKOFF_RESET_S = 600.0
"""A replica that served this long (from its first accepted sample to its death) clears its
slot's count of crashes: the next crash waits BACKOFF_INITIAL_S again (the kubelet's 10 min)."""
HOPELESS_CRASHES = 6
"""Replicas in a row of a slot that died before serving after which the slot is hopeless: its
wait has reached BACKOFF_MAX_S, after 10+20+40+80+160 s of waits and six starts that all
failed. The slot still tries every 5 min, as a Deployment would; a run whose every slot is
hopeless with no replica running fails (see ReplicaRestarts)."""


def backoff_s(crashes: int) -> float:
    """The wait before the next start of a slot whose last `crashes` replicas (>= 1) died before serving."""
    return min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2.0 ** min(crashes - 1, 32))


@dataclass
class Slot:
    """One fixed replica of a pool across its replacements (a Deployment's pod)."""

    name: str
    """The id of its first replica (<pool>-<n>), as the progress line names it."""
    pool: str
    crashes: int = 0
    """Its replicas in a row that died before they served (since the last reset)."""
    served_at: float | None = None
    """When its current replica's first sample was seen accepted (None: not yet)."""
    next_start_at: float | None = None
    """When its next replica may start (None: it waits for no start; its replica runs or left)."""

    def served(self, now: float) -> None:
        """Its current replica served (seen at `now`; the first sighting counts)."""
        if self.served_at is None:
            self.served_at = now

    def died(self, now: float) -> float:
        """Its current replica died with an error at `now`: the seconds until the next may start
        (0: at once, it had served). Counts the crash or, after BACKOFF_RESET_S of serving, resets."""
        served_at, self.served_at = self.served_at, None
        if served_at is not None:
            if now - served_at >= BACKOFF_RESET_S:
                self.crashes = 0
            wait = 0.0
        else:
            self.crashes += 1
            wait = backoff_s(self.crashes)
        self.next_start_at = now + wait
        return wait

    def due(self, now: float) -> bool:
        """Its next replica's start is due."""
        return self.next_start_at is not None and now >= self.next_start_at

    @property
    def hopeless(self) -> bool:
        """HOPELESS_CRASHES replicas in a row died before serving."""
        return self.crashes >= HOPELESS_CRASHES
