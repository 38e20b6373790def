"""The scaling inputs, from Prometheus: the window to read (since the replicas settled), the
PromQL of each input and its parsing. The same queries and the same window feed `streamrl
run` and the operator."""

from __future__ import annotations

from dataclasses import dataclass

from streamrl.scaling.policy import Observation

MIN_WINDOW_ROUNDS, MAX_WINDOW_ROUNDS = 2, 4


def input_window_s(now: float, settled_at: float | None, interval_s: float) -> float | None:
    """Seconds of history to read the inputs over: since the replicas last settled (every
    replica asked for connected), at most four rounds back (a minute at the default 15 s),
    so the policy follows a changing workload. None until two rounds have passed since:
    older data would predate the change, and over a window longer than its life a young
    replica's counters read low (rate() divides by the whole window)."""
    if settled_at is None or now - settled_at < MIN_WINDOW_ROUNDS * interval_s:
        return None
    return min(now - settled_at, MAX_WINDOW_ROUNDS * interval_s)


def input_queries(rljob: str, window_s: float, namespace: str | None = None) -> dict[str, str]:
    """{input name: PromQL} for one RLJob (in `namespace`, when its series carry one) over
    the last `window_s` seconds.

    The stage times come from the bubble metrics, the same way in every pipeline mode:
    T_gen = iteration wall time x generator utilisation (busy fraction, averaged over
    replicas) and T_train = iteration wall time x trainer utilisation. (The trainer's
    per-iteration generation time cannot serve: in one-step asynchronous mode an
    iteration's samples are mostly generated before it starts.)"""
    def quoted(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"')

    j = quoted(rljob) + (f'", namespace="{quoted(namespace)}' if namespace else "")
    w = f"[{max(2, int(round(window_s)))}s]"

    def utilisation(stage: str) -> str:
        busy = f'streamrl_stage_busy_seconds_total{{rljob="{j}", stage="{stage}"}}'
        return f"sum(rate({busy}{w})) / count({busy})"

    return {
        "iteration_s": f'max(avg_over_time(streamrl_iteration_wall_seconds{{rljob="{j}"}}{w}))',
        "generator_utilisation": utilisation("generator"),
        "trainer_utilisation": utilisation("trainer"),
        "iterations": f'max(changes(streamrl_iteration{{rljob="{j}"}}{w}))',
        # Idle for lack of work while work was out: the barrier (no work pending or out on
        # any replica: every generator waits for the trainer) is the pipeline's shape, not
        # spare capacity, and is taken off.
        "idle_no_work": f'clamp_min(sum(rate(streamrl_stage_idle_seconds_total{{rljob="{j}", stage="generator", '
                        f'reason="no_work"}}{w})) / count(streamrl_stage_busy_seconds_total{{rljob="{j}", '
                        f'stage="generator"}}) - scalar(sum(rate(streamrl_generation_barrier_seconds_total'
                        f'{{rljob="{j}"}}{w})) or vector(0)), 0)',  # no barrier series (an older trainer): 0
        "pool_samples_per_s": f'sum by (pool) (rate(streamrl_samples_streamed_total{{rljob="{j}"}}{w})) '
                              f'/ count by (pool) (streamrl_samples_streamed_total{{rljob="{j}"}})',
        "pool_connected": f'max by (pool) (streamrl_pool_replicas{{rljob="{j}"}})',
    }


@dataclass(frozen=True)
class Inputs:
    """What Prometheus said, parsed."""

    observation: Observation | None
    """None until an iteration finished within the window (nothing to judge yet)."""
    samples_per_s: dict[str, float]
    """Measured samples/s of one replica, by pool."""
    connected: dict[str, int]
    """Replicas connected to the trainer, by pool."""


def _scalar(result: list[dict]) -> float | None:
    for r in result:
        v = float(r["value"][1])
        if v == v and v not in (float("inf"), float("-inf")):  # NaN (0/0) and ±Inf mean "no data"
            return v
    return None


def _by_pool(result: list[dict]) -> dict[str, float]:
    return {r["metric"].get("pool", ""): float(r["value"][1]) for r in result
            if float(r["value"][1]) == float(r["value"][1])}


def parse_inputs(results: dict[str, list[dict]], min_iterations: int = 2) -> Inputs:
    """Inputs from the instant-query result vectors of input_queries(); no observation until
    `min_iterations` iterations finished within the window (the first may have begun
    before the last change)."""
    wall = _scalar(results["iteration_s"])
    u_gen, u_train = _scalar(results["generator_utilisation"]), _scalar(results["trainer_utilisation"])
    iterations = _scalar(results["iterations"]) or 0.0
    obs = None
    if wall is not None and u_gen is not None and u_train is not None and iterations >= min_iterations:
        obs = Observation(wall * min(1.0, u_gen), wall * min(1.0, u_train), _scalar(results["idle_no_work"]) or 0.0)
    return Inputs(obs, _by_pool(results["pool_samples_per_s"]),
                  {p: int(v) for p, v in _by_pool(results["pool_connected"]).items()})


def query_window_s(now: float, settled_at: float | None, interval_s: float) -> float:
    """Seconds of history to query this round: the policy's window once the replicas have
    run settled for two rounds; until then two rounds, read only for who is connected."""
    return input_window_s(now, settled_at, interval_s) or MIN_WINDOW_ROUNDS * interval_s
