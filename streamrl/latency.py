"""Measured costs read off points: PTL(BS), the seconds of one decode step as a function of
batch size (one interpolation for the dispatcher's long-tail planner and the planner's
profiles), and a fixed-plus-per-unit line (what `streamrl profile` fits to a learner's
micro-batches and to an engine's admitting steps)."""

from __future__ import annotations

from collections.abc import Sequence


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
