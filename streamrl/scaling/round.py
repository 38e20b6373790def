"""One autoscaler round, shared by both drivers (streamrl.local.autoscaler for `streamrl run`,
streamrl.operator.scaling for the operator): wait until every replica asked for has
connected and two rounds were measured since, then let the policy decide over the spec's
pools. Pure: Prometheus's parsed answers and the clock come in."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from streamrl.scaling.inputs import Inputs, input_window_s
from streamrl.scaling.policy import Decision, Pool, State, behavior_from_spec, decide, pools_from_spec


def fill_unmeasured(pools: list[Pool]) -> list[Pool]:
    """A pool with no replica running has no measured throughput: assume the mean of the
    measured pools', so it can still be chosen (on cost) when it has room."""
    measured = [p.samples_per_s for p in pools if p.samples_per_s > 0]
    if not measured:
        return pools
    mean = sum(measured) / len(measured)
    return [p if p.samples_per_s > 0 or p.replicas > 0 else replace(p, samples_per_s=mean) for p in pools]


@dataclass(frozen=True)
class Round:
    """One autoscaler round: a decision, or what it waits for."""

    settled_at: float | None
    """To keep for the next round (None: not settled, or a change was just made)."""
    state: State
    connected: dict[str, int]
    """Replicas connected by pool, as Prometheus saw them."""
    waiting: Literal["connecting", "measuring", "iterations"] | None = None
    """`connecting`: replicas asked for are not all connected (a change is joining or
    leaving); `measuring`: fewer than two rounds since they settled; `iterations`: fewer
    than two iterations in the window. None: decided."""
    window_s: float | None = None
    decision: Decision | None = None
    pools: tuple[Pool, ...] = ()
    """The pools the policy saw (with bounds), when it decided."""


def scaling_round(autoscaling, generators, asked: dict[str, int], inputs: Inputs, state: State,
                  settled_at: float | None, now: float, room: dict[str, int] | None = None) -> Round:
    """Decide only once every replica asked for has been connected for two rounds (the
    inputs then cover the replicas as they are). `autoscaling` and `generators` are the
    spec's; `room` caps how many more replicas each pool may get (the local cores)."""
    connected = {p: inputs.connected.get(p, 0) for p in asked}
    if connected != asked:  # a replica is starting, leaving or gone: measure afresh once settled
        return Round(None, state, connected, "connecting")
    settled_at = now if settled_at is None else settled_at
    window = input_window_s(now, settled_at, autoscaling.interval_seconds)
    if window is None:  # what the inputs cover would predate the change
        return Round(settled_at, state, connected, "measuring")
    if inputs.observation is None:
        return Round(settled_at, state, connected, "iterations", window)
    pools = pools_from_spec(generators, asked, inputs.samples_per_s)
    if room is not None:
        pools = [replace(p, max_replicas=min(p.max_replicas, p.replicas + room.get(p.name, 0))) for p in pools]
    pools = fill_unmeasured(pools)
    decision = decide(inputs.observation, pools, behavior_from_spec(autoscaling), state, now,
                      autoscaling.idle_threshold, autoscaling.min_utilisation, autoscaling.hysteresis,
                      autoscaling.step)
    return Round(None if decision.step else settled_at, decision.state, connected, None, window, decision,
                 tuple(pools))
