"""The long-tail planner: how many replicas serve the predicted long tail, at what batch cap.

Pure functions over numbers (no I/O, no gRPC). One replica's time for M samples of
length L at batch size BS is PTL(BS) * L * ceil(M / BS), with PTL the measured per-token
decode latency at that batch size (objective `sum`, as published). Long outputs want small
batches (they decode faster per token); short ones tolerate large batches. Objective `max`
prices a group as continuous batching runs it instead (`batched_time`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from streamrl.latency import interpolate_ptl

Objective = Literal["sum", "max"]


@dataclass(frozen=True)
class LatencyProfile:
    """PTL(BS): seconds per decode step of one replica as a function of its batch size."""

    points: tuple[tuple[int, float], ...]
    """(batch size, seconds per decode step), at least one point."""

    def __post_init__(self):
        if not self.points:
            raise ValueError("a latency profile needs at least one (batch size, seconds) point")
        object.__setattr__(self, "points", tuple(sorted(self.points)))

    def ptl(self, batch_size: int) -> float:
        """Linear interpolation between measured points; beyond them, the nearest segment's slope."""
        return interpolate_ptl(self.points, batch_size)


@dataclass(frozen=True)
class ReplicaProfile:
    """A replica as the planner sees it."""

    replica_id: str
    profile: LatencyProfile
    max_batch_size: int


@dataclass(frozen=True)
class LongTailDemand:
    """An iteration's work, split by prediction: how many samples of which length."""

    num_long_samples: int
    num_regular_samples: int
    long_length: float
    """L_long: P90 of recent output lengths (tokens)."""
    regular_length: float
    """L_reg: P50 of recent output lengths (tokens)."""


@dataclass(frozen=True)
class LongTailPlan:
    long_replicas: tuple[str, ...]
    """Replicas that serve the long tail, at long_batch_cap."""
    regular_replicas: tuple[str, ...]
    """Replicas that serve the rest, at their own max batch size."""
    long_batch_cap: int
    estimated_s: float
    """The objective's value for this plan (seconds)."""
    estimates_s: tuple[float, ...]
    """The objective for each number of long-tail replicas 0..N (for inspection)."""


def _share(num_samples: int, num_replicas: int, batch_cap: int) -> tuple[int, int]:
    """(samples per replica, its batch size) for num_samples spread evenly over num_replicas."""
    per_replica = math.ceil(num_samples / num_replicas)
    return per_replica, max(1, min(batch_cap, per_replica))


def group_time(profile: LatencyProfile, num_samples: int, num_replicas: int, length: float, batch_cap: int) -> float:
    """Estimated seconds for num_samples of `length` tokens spread evenly over num_replicas
    identical replicas decoding at most batch_cap at once."""
    if num_samples == 0:
        return 0.0
    if num_replicas == 0:
        return math.inf
    per_replica, bs = _share(num_samples, num_replicas, batch_cap)
    return profile.ptl(bs) * length * math.ceil(per_replica / bs)


def batched_time(profile: LatencyProfile, num_samples: int, num_replicas: int, mean_length: float,
                 longest: float, batch_cap: int) -> float:
    """Estimated wall seconds under continuous batching: each of num_replicas identical replicas
    keeps min(batch_cap, its share) sequences running while work waits, so it steps through its
    share of the tokens that many at a time, and no fewer steps than the longest sample takes.
    Unlike group_time, a wave of short samples is not charged the long ones' length."""
    if num_samples == 0:
        return 0.0
    if num_replicas == 0:
        return math.inf
    per_replica, bs = _share(num_samples, num_replicas, batch_cap)
    return profile.ptl(bs) * max(longest, per_replica * mean_length / bs)


def _slowest(replicas: list[ReplicaProfile], batch_size: int) -> LatencyProfile:
    return max((r.profile for r in replicas), key=lambda p: p.ptl(batch_size))


def plan_long_tail(demand: LongTailDemand, replicas: list[ReplicaProfile], long_batch_cap: int,
                   objective: Objective = "sum") -> LongTailPlan:
    """Choose N_long in 0..N minimising the estimated generation time.

    `sum` adds the two groups' times, each by group_time (as published). `max` takes the
    slower group, each by batched_time: the wall time when both run at once, as continuous
    batching runs them (group_time charges every wave of a full batch the length of its
    longest sample, which overprices a mixed batch and makes `max` split where the long-tail
    group is the slower by far). With N_long = 0 every replica runs everything at its full
    batch and the long samples set the pace; with N_long = N every replica runs at the
    long-tail cap. Long-tail replicas are the ones fastest at small batches; a group is
    estimated with its slowest member's profile.
    """
    if not replicas:
        raise ValueError("no replicas to dispatch to")
    if objective not in ("sum", "max"):
        raise ValueError(f"dispatch objective {objective!r}: expected 'sum' or 'max'")
    num_long_samples, num_regular_samples = demand.num_long_samples, demand.num_regular_samples
    long_length, regular_length = demand.long_length, demand.regular_length
    ordered = sorted(replicas, key=lambda r: (r.profile.ptl(long_batch_cap), r.replica_id))
    total = num_long_samples + num_regular_samples
    pace = long_length if num_long_samples else regular_length
    mean = (num_long_samples * long_length + num_regular_samples * regular_length) / total if total else 0.0

    def one_group(profile: LatencyProfile, samples: int, n: int, length: float, cap: int, longest: float) -> float:
        if objective == "sum":
            return group_time(profile, samples, n, longest, cap)
        return batched_time(profile, samples, n, length, longest, cap)

    estimates = []
    for n_long in range(len(ordered) + 1):
        longs, regulars = ordered[:n_long], ordered[n_long:]
        if n_long == 0:
            cap = min(r.max_batch_size for r in regulars)
            t = one_group(_slowest(regulars, cap), total, len(regulars), mean, cap, pace)
        elif not regulars:
            t = one_group(_slowest(longs, long_batch_cap), total, n_long, mean, long_batch_cap, pace)
        else:
            cap = min(r.max_batch_size for r in regulars)
            t_long = one_group(_slowest(longs, long_batch_cap), num_long_samples, n_long, long_length,
                               long_batch_cap, long_length)
            t_reg = one_group(_slowest(regulars, cap), num_regular_samples, len(regulars), regular_length, cap,
                              regular_length)
            t = t_long + t_reg if objective == "sum" else max(t_long, t_reg)
        estimates.append(t)
    best = min(range(len(estimates)), key=lambda n: (estimates[n], n))
    return LongTailPlan(
        tuple(r.replica_id for r in ordered[:best]),
        tuple(r.replica_id for r in ordered[best:]),
        long_batch_cap,
        estimates[best],
        tuple(estimates),
    )


def split_long_tail(predicted_lengths: dict[str, float], alpha: float) -> tuple[list[str], list[str]]:
    """(long-tail ids, regular ids): the top `alpha` fraction by predicted length, longest first."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    ranked = sorted(predicted_lengths, key=lambda k: (-predicted_lengths[k], k))
    n_long = round(alpha * len(ranked))
    return ranked[:n_long], ranked[n_long:]


def length_targets(recent_lengths: list[int]) -> tuple[float, float]:
    """(L_long, L_reg) = (P90, P50) of the recent output-length distribution."""
    if not recent_lengths:
        raise ValueError("no recent output lengths")
    xs = sorted(recent_lengths)

    def pct(q: float) -> float:  # linear interpolation between closest ranks
        pos = q * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return pct(0.9), pct(0.5)
