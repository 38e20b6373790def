"""The elastic-scaling policy: which generator pool gets one more replica or one fewer,
and why. Pure (no I/O, time passed in), shared by `streamrl run` and the operator.

Inputs are what the bubble metrics say: recent per-iteration generation and training
times, how long generators sat idle for lack of work, replicas per pool and each pool's
measured throughput and configured cost. Rules:

- scale up by one when generation is the bottleneck (Δ = T_gen − T_train > 0) and the
  generators would still be busy at least `min_utilisation` of the time with one more:
  T_gen − Δ′ ≥ min_utilisation · T_train, where Δ′ is the generation time one more
  replica saves, estimated from measured per-replica throughput (a replica of pool q
  turns total throughput R into R + r_q, so T_gen shrinks by T_gen · r_q / (R + r_q)).
  With min_utilisation = 1 this is the published rule, Δ > Δ′: never add a replica that
  would sit partly idle; lower values trade replica-seconds for a smaller pipeline
  bubble. The pool is the one with the best throughput per cost that still has room;
- scale down by one when generators sit idle for lack of work beyond a threshold, or when
  one replica fewer would still keep generation no slower than training; the pool is the
  one with the worst throughput per cost above its minimum;
- in the spirit of Kubernetes HPA `behavior` (same field names): a recommendation must
  hold for `stabilizationWindowSeconds` before it is acted on, and `policies` cap the step
  (`type: Pods`, `value` replicas per `periodSeconds`; every policy must allow a step, as
  with `selectPolicy: Min`); after a change, the opposite direction waits
  `cooldown_seconds`;
- when training is the bottleneck and generators cannot shrink further, say so
  (`trainer_bound`): resizing the trainer comes later.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal


@dataclass(frozen=True)
class ScalingPolicy:
    """At most `value` replicas per `periodSeconds` (HPA's `type: Pods` policy)."""

    value: int = 1
    period_seconds: float = 60.0


@dataclass(frozen=True)
class ScalingRules:
    """One direction of HPA-style behaviour."""

    stabilization_window_seconds: float = 0.0
    policies: tuple[ScalingPolicy, ...] = (ScalingPolicy(),)


@dataclass(frozen=True)
class Behavior:
    scale_up: ScalingRules = ScalingRules(stabilization_window_seconds=0.0)
    scale_down: ScalingRules = ScalingRules(stabilization_window_seconds=300.0)
    cooldown_seconds: float = 60.0
    """After a change, none in the opposite direction for this long (no flapping on one
    noisy reading at a phase change)."""


@dataclass(frozen=True)
class Pool:
    name: str
    replicas: int
    min_replicas: int = 0
    max_replicas: int = 1 << 20
    samples_per_s: float = 0.0
    """Measured throughput of one replica of this pool (0 = not measured yet)."""
    cost: float = 1.0
    """Relative cost of one replica (e.g. its GPU's price per hour)."""

    @property
    def value(self) -> float:
        """Throughput per cost."""
        return self.samples_per_s / self.cost if self.cost > 0 else 0.0


@dataclass(frozen=True)
class Observation:
    generation_s: float
    """Generation time per iteration, recent mean (seconds)."""
    train_s: float
    """Training time per iteration, recent mean (seconds)."""
    idle_no_work: float = 0.0
    """Fraction of generator time idle for lack of work, recent."""


@dataclass(frozen=True)
class State:
    """What the policy remembers between calls."""

    recommendations: tuple[tuple[float, int], ...] = ()
    """(time, recommended step: +1, 0 or -1) over the last two horizons (windows, periods)."""
    actions: tuple[tuple[float, int], ...] = ()
    """(time, replicas added (> 0) or removed (< 0)) within the longest policy period."""


@dataclass(frozen=True)
class Decision:
    replicas: dict[str, int]
    """Desired replicas per pool."""
    reason: str
    """Why, for a person (events, status, logs)."""
    step: int = 0
    """+1, 0 or -1: what changed."""
    pool: str | None = None
    """The pool that changed."""
    trainer_bound: bool = False
    """Training is the bottleneck and generators are at their minimum."""
    state: State = field(default_factory=State)


def _saving(obs: Observation, pools: list[Pool], pool: Pool) -> float:
    """Generation seconds per iteration one more replica of `pool` would save."""
    total = sum(p.replicas * p.samples_per_s for p in pools)
    if total <= 0 or pool.samples_per_s <= 0:
        return 0.0
    return obs.generation_s * pool.samples_per_s / (total + pool.samples_per_s)


def _after_removal(obs: Observation, pools: list[Pool], pool: Pool) -> float:
    """Generation seconds per iteration with one replica of `pool` fewer."""
    total = sum(p.replicas * p.samples_per_s for p in pools)
    rest = total - pool.samples_per_s
    return obs.generation_s * total / rest if rest > 0 else float("inf")


def recommend(obs: Observation, pools: list[Pool], idle_threshold: float = 0.2,
              min_utilisation: float = 1.0) -> tuple[int, Pool | None, str, bool]:
    """The rule's raw answer: (step, pool, reason, trainer_bound), before windows and policies."""
    delta = obs.generation_s - obs.train_s
    growable = sorted((p for p in pools if p.replicas < p.max_replicas and p.samples_per_s > 0),
                      key=lambda p: (-p.value, p.name))
    # Never the last replica of the job, whatever the minimums say: nothing would generate.
    last = sum(p.replicas for p in pools) <= 1
    shrinkable = sorted((p for p in pools if p.replicas > p.min_replicas and p.samples_per_s > 0 and not last),
                        key=lambda p: (p.value, p.name))
    if delta > 0 and growable:
        best = growable[0]
        saving = _saving(obs, pools, best)
        after = obs.generation_s - saving
        if after >= min_utilisation * obs.train_s:
            return (1, best, f"generation-bound: generation {obs.generation_s:.2f}s - training {obs.train_s:.2f}s "
                             f"= {delta:.2f}s per iteration; one more {best.name} replica saves {saving:.2f}s and "
                             f"generation ({after:.2f}s) stays >= {min_utilisation:.0%} of training", False)
        return (0, None, f"balanced: one more replica would save {saving:.2f}s, leaving generation ({after:.2f}s) "
                         f"under {min_utilisation:.0%} of training ({obs.train_s:.2f}s)", False)
    if delta > 0:
        return 0, None, "generation-bound, but every pool is at its maximum", False
    if shrinkable:
        worst = shrinkable[0]
        if obs.idle_no_work > idle_threshold:
            return (-1, worst, f"generators idle for lack of work {obs.idle_no_work:.0%} of the time "
                               f"(> {idle_threshold:.0%}): one {worst.name} replica fewer", False)
        after = _after_removal(obs, pools, worst)
        if after <= obs.train_s:
            return (-1, worst, f"training-bound: with one {worst.name} replica fewer generation would take "
                               f"{after:.2f}s, still within training's {obs.train_s:.2f}s", False)
        return 0, None, f"balanced: one replica fewer would make generation ({after:.2f}s) the bottleneck", False
    bound = delta < 0
    return (0, None, "training-bound and every pool is at its minimum: the trainer is the bottleneck"
            if bound else "balanced", bound)


def decide(obs: Observation, pools: list[Pool], behavior: Behavior, state: State, now: float,
           idle_threshold: float = 0.2, min_utilisation: float = 1.0) -> Decision:
    """Apply the rule, then the stabilization windows and rate policies."""
    current = {p.name: p.replicas for p in pools}
    step, pool, reason, bound = recommend(obs, pools, idle_threshold, min_utilisation)
    horizon = max([behavior.scale_up.stabilization_window_seconds, behavior.scale_down.stabilization_window_seconds,
                   behavior.cooldown_seconds]
                  + [p.period_seconds for r in (behavior.scale_up, behavior.scale_down) for p in r.policies])
    # Twice the horizon: a window is covered once some recommendation predates its start.
    recs = tuple((t, s) for t, s in state.recommendations if t > now - 2 * horizon) + ((now, step),)
    actions = tuple((t, d) for t, d in state.actions if t > now - horizon)
    new_state = replace(state, recommendations=recs, actions=actions)
    if step == 0:
        return Decision(current, reason, trainer_bound=bound, state=new_state)
    rules = behavior.scale_up if step > 0 else behavior.scale_down
    window = [s for t, s in recs if t >= now - rules.stabilization_window_seconds]
    # Act only when every recommendation within the window agrees (HPA: the least drastic wins).
    covered = min(t for t, _ in recs) <= now - rules.stabilization_window_seconds
    if any(s != step for s in window) or not covered:
        return Decision(current, f"{reason}; waiting: not yet stable for "
                                 f"{rules.stabilization_window_seconds:.0f}s", state=new_state)
    opposite = [t for t, d in actions if (d > 0) != (step > 0) and t > now - behavior.cooldown_seconds]
    if opposite:
        return Decision(current, f"{reason}; cooling down: a replica was {'removed' if step > 0 else 'added'} "
                                 f"{now - max(opposite):.0f}s ago (cooldown {behavior.cooldown_seconds:.0f}s)",
                        state=new_state)
    for policy in rules.policies:
        moved = sum(abs(d) for t, d in actions if t > now - policy.period_seconds and (d > 0) == (step > 0))
        if moved + 1 > policy.value:
            return Decision(current, f"{reason}; held: at most {policy.value} per {policy.period_seconds:.0f}s",
                            state=new_state)
    desired = dict(current)
    desired[pool.name] += step
    return Decision(desired, reason, step, pool.name, False,
                    replace(new_state, actions=actions + ((now, step),)))


def behavior_from_spec(spec) -> Behavior:
    """The policy's behaviour from `spec.autoscaling.behavior` (an AutoscalingSpec's)."""
    def rules(r) -> ScalingRules:
        return ScalingRules(float(r.stabilization_window_seconds),
                            tuple(ScalingPolicy(p.value, float(p.period_seconds)) for p in r.policies))

    return Behavior(rules(spec.behavior.scale_up), rules(spec.behavior.scale_down), float(spec.cooldown_seconds))


def pools_from_spec(generators, replicas: dict[str, int], samples_per_s: dict[str, float]) -> list[Pool]:
    """The policy's view of the pools: bounds and cost from the spec, current replicas and
    measured per-replica throughput from the run."""
    return [Pool(p.name, replicas.get(p.name, 0), p.min_replicas,
                 p.max_replicas if p.max_replicas is not None else max(p.replicas, replicas.get(p.name, 0)),
                 samples_per_s.get(p.name, 0.0), p.cost)
            for p in generators.pools]


# ---- inputs, from Prometheus ------------------------------------------------------------
# The same PromQL and the same window feed `streamrl run` and the operator.

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
        "idle_no_work": f'sum(rate(streamrl_stage_idle_seconds_total{{rljob="{j}", stage="generator", '
                        f'reason="no_work"}}{w})) / count(streamrl_stage_busy_seconds_total{{rljob="{j}", '
                        f'stage="generator"}})',
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
    if None not in (wall, u_gen, u_train) and iterations >= min_iterations:
        obs = Observation(wall * min(1.0, u_gen), wall * min(1.0, u_train), _scalar(results["idle_no_work"]) or 0.0)
    return Inputs(obs, _by_pool(results["pool_samples_per_s"]),
                  {p: int(v) for p, v in _by_pool(results["pool_connected"]).items()})


def fill_unmeasured(pools: list[Pool]) -> list[Pool]:
    """A pool with no replica running has no measured throughput: assume the mean of the
    measured pools', so it can still be chosen (on cost) when it has room."""
    measured = [p.samples_per_s for p in pools if p.samples_per_s > 0]
    if not measured:
        return pools
    mean = sum(measured) / len(measured)
    return [p if p.samples_per_s > 0 or p.replicas > 0 else replace(p, samples_per_s=mean) for p in pools]


# ---- one round, shared by both autoscalers ------------------------------------------------

def query_window_s(now: float, settled_at: float | None, interval_s: float) -> float:
    """Seconds of history to query this round: the policy's window once the replicas have
    run settled for two rounds; until then two rounds, read only for who is connected."""
    return input_window_s(now, settled_at, interval_s) or MIN_WINDOW_ROUNDS * interval_s


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
                      autoscaling.idle_threshold, autoscaling.min_utilisation)
    return Round(None if decision.step else settled_at, decision.state, connected, None, window, decision,
                 tuple(pools))
