"""PTL(BS), the seconds of one decode step as a function of batch size, read off measured
points: one interpolation for the dispatcher's long-tail planner and the planner's profiles."""

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
