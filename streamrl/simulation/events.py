"""The discrete-event core: callbacks in time order (ties as scheduled), processes as generators
(yield seconds, or a Signal to wait on), and each process's busy/idle spans with a reason, as
the services' stage clocks record them. Knows nothing of RL."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Generator
from typing import Any

Process = Generator[Any, None, None]
"""Yields a number of seconds to sleep or a Signal to wait on."""


class Event:
    __slots__ = ("time", "fn", "args", "cancelled")

    def __init__(self, time: float, fn: Callable, args: tuple):
        self.time, self.fn, self.args, self.cancelled = time, fn, args, False

    def cancel(self) -> None:
        self.cancelled = True


class Simulation:
    def __init__(self):
        self.now = 0.0
        self._heap: list[tuple[float, int, Event]] = []
        self._order = itertools.count()
        self._stopped = False

    def at(self, time: float, fn: Callable, *args) -> Event:
        assert time >= self.now - 1e-9, f"scheduling in the past: {time} < {self.now}"
        event = Event(max(time, self.now), fn, args)
        heapq.heappush(self._heap, (event.time, next(self._order), event))
        return event

    def after(self, seconds: float, fn: Callable, *args) -> Event:
        return self.at(self.now + seconds, fn, *args)

    def spawn(self, process: Process) -> None:
        """Start a process now (its first step runs in this call)."""
        self._step(process)

    def _step(self, process: Process) -> None:
        try:
            what = next(process)
        except StopIteration:
            return
        if isinstance(what, Signal):
            what.waiters.append(process)
        else:
            self.after(float(what), self._step, process)

    def stop(self) -> None:
        """End run() after the current event (what is still scheduled never happens)."""
        self._stopped = True

    def run(self, until: float = math.inf) -> None:
        """Run events in time order until none is left, the next is after `until`, or stop()."""
        heap = self._heap
        self._stopped = False
        while heap and heap[0][0] <= until and not self._stopped:
            time, _, event = heapq.heappop(heap)
            if event.cancelled:
                continue
            self.now = time
            event.fn(*event.args)


class Signal:
    """Something processes wait for; fire() wakes every waiter (at the current time, in order)."""

    def __init__(self, sim: Simulation):
        self.sim = sim
        self.waiters: list[Process] = []

    def fire(self) -> None:
        waiters, self.waiters = self.waiters, []
        for process in waiters:
            self.sim.at(self.sim.now, self.sim._step, process)


class Track:
    """One process's activity over simulated time: spans of (state, reason), consecutive
    equal ones merged, and the seconds spent in each so far."""

    def __init__(self, sim: Simulation, name: str, state: str = "idle", reason: str = ""):
        self.sim = sim
        self.name = name
        self.spans: list[list] = []
        """[start, end, state, reason]; the last one is open (its end moves) until close()."""
        self._totals: dict[tuple[str, str], float] = {}
        self.started = sim.now
        self.ended: float | None = None
        self.spans.append([sim.now, sim.now, state, reason])

    @property
    def current(self) -> tuple[str, str]:
        span = self.spans[-1]
        return span[2], span[3]

    def set(self, state: str, reason: str = "") -> None:
        if self.ended is not None or (state, reason) == self.current:
            return
        self._close_last()
        if self.spans[-1][0] == self.spans[-1][1]:
            self.spans.pop()  # a state that lasted no time
        prev = self.spans[-1] if self.spans else None
        if prev is not None and prev[2:] == [state, reason] and prev[1] == self.sim.now:
            self._totals[(state, reason)] -= prev[1] - prev[0]  # open again: counted when it closes
        else:
            self.spans.append([self.sim.now, self.sim.now, state, reason])

    def _close_last(self) -> None:
        last = self.spans[-1]
        last[1] = self.sim.now
        self._totals[(last[2], last[3])] = self._totals.get((last[2], last[3]), 0.0) + last[1] - last[0]

    def seconds(self, state: str, reason: str | None = None) -> float:
        """Seconds so far in `state` (with `reason`, or any reason)."""
        total = sum(v for (s, r), v in self._totals.items() if s == state and (reason is None or r == reason))
        s, r = self.current
        if self.ended is None and s == state and (reason is None or r == reason):
            total += self.sim.now - self.spans[-1][0]
        return total

    def close(self) -> None:
        """The process ended (a replica left, the run is over)."""
        if self.ended is None:
            self._close_last()
            self.ended = self.sim.now

    @property
    def lifetime_s(self) -> float:
        return (self.ended if self.ended is not None else self.sim.now) - self.started

    def as_dicts(self) -> list[dict]:
        """Spans as the run report's timelines hold them (the open one ends now)."""
        out = [{"start": a, "end": b, "state": s, "reason": r} for a, b, s, r in self.spans]
        if self.ended is None:
            out[-1]["end"] = self.sim.now
        return [d for d in out if d["end"] > d["start"]]
