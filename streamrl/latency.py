"""Measured costs read off points: PTL(BS), the seconds of one decode step as a function of
batch size (one interpolation for the dispatcher's long-tail planner and the planner's
profiles), and a fixed-plus-per-unit line (what `streamrl profile` fits to a learner's
micro-batches and to an engine's admitting steps); and how a replica keeps and reports its
PTL(BS) as it serves (ptl_bucket, observe_ptl), pure so the simulator's replicas report alike."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence


def interpolate_ptl(points: Sequence[tuple[int, float]], batch_size: int, floor: float = 0.0) -> float:
    """Linear between the measured (batch size, seconds) points, sorted by batch size; beyond
    them, the nearest segment's slope; never below `floor`."""
    if len(points) == 1:
        return points[0][1]
    for (b0, t0), (b1, t1) in zip(points, points[1:]):
        if batch_size <= b1 or (b1, t1) == points[-1]:
            return max(floor, t0 + (t1 - t0) * (batch_size - b0) / (b1 - b0))
    raise AssertionError("unreachable")


def fit_fixed_plus_per_unit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(fixed seconds, seconds per unit) fitted by least squares on relative error to measured
    (units, seconds) points (each weighted 1 / seconds²: a timing's noise grows with it, and in
    plain least squares the largest size's noise alone decides the fixed part, which the small
    sizes measure); both kept >= 0 (a negative intercept or slope is refitted through the origin)."""
    if len({n for n, _ in points}) < 2:
        raise ValueError("fitting a fixed and a per-unit cost needs points at at least two sizes")
    xs, ys = [float(n) for n, _ in points], [s for _, s in points]
    ws = [1.0 / (y * y) if y > 0 else 1.0 for y in ys]
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs)) / sw
    my = sum(w * y for w, y in zip(ws, ys)) / sw
    slope = (sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys))
             / sum(w * (x - mx) ** 2 for w, x in zip(ws, xs)))
    intercept = my - slope * mx
    if intercept < 0 or slope < 0:
        return 0.0, max(0.0, sum(w * x * y for w, x, y in zip(ws, xs, ys)) / sum(w * x * x for w, x in zip(ws, xs)))
    return intercept, slope


PTL_SMOOTHING = 0.1
"""Weight of each served decode step in its batch-size bucket's reported seconds (an EWMA)."""


def ptl_bucket(batch_size: int) -> int:
    """The point of the reported PTL(BS) a decode step of this batch size counts toward: powers
    of two (and the batch size itself below 4). Pure: replicas and the simulator's replicas
    report by it."""
    return batch_size if batch_size < 4 else 1 << (batch_size.bit_length() - 1)


def observe_ptl(points: dict[int, float], batch_size: int, seconds: float, steps: int = 1) -> None:
    """Fold `steps` served decode steps of `seconds` each at `batch_size` into `points` (bucket ->
    smoothed seconds), as a replica's reported PTL(BS) is kept."""
    b = ptl_bucket(batch_size)
    old = points.get(b)
    keep = (1 - PTL_SMOOTHING) ** steps
    points[b] = seconds if old is None else old * keep + seconds * (1 - keep)


def ptl_batch_sizes(capacity: int) -> list[int]:
    """The batch sizes PTL(BS) is measured at: powers of two up to the capacity, and the capacity."""
    return sorted({1 << k for k in range(capacity.bit_length())} | {capacity})


class ServedLatency:
    """A replica's PTL(BS) as its engine serves it: each bucket's smoothed seconds per step
    (observe_ptl), observed on the engine thread and read by the agent's load reporter thread.
    Steps an engine times to measure itself are not served ones: `measured` keeps them out of
    the observed points and then records what the measurement found."""

    def __init__(self) -> None:
        self._points: dict[int, float] = {}
        self._lock = threading.Lock()

    def observe(self, batch_size: int, seconds: float) -> None:
        with self._lock:
            observe_ptl(self._points, batch_size, seconds)

    def points(self) -> list[tuple[int, float]]:
        with self._lock:
            return sorted(self._points.items())

    @contextlib.contextmanager
    def measuring(self, record: bool) -> Iterator[list[tuple[int, float]]]:
        """While an engine times its own steps: the list it fills with (batch size, seconds);
        on leaving, the observed points as they were, plus those when `record` (the context the
        replica reports)."""
        with self._lock:
            observed = dict(self._points)
        out: list[tuple[int, float]] = []
        try:
            yield out
        finally:
            with self._lock:
                self._points = observed
        if record:
            with self._lock:
                self._points.update((ptl_bucket(bs), seconds) for bs, seconds in out)
