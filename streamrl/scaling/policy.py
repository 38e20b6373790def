"""The elastic-scaling policy: which generator pool gets one more replica or one fewer,
and why. Pure (no I/O, time passed in), shared by `streamrl run` and the operator.

Inputs are what the bubble metrics say: recent per-iteration generation and training
times, how long generators sat idle for lack of work, replicas per pool and each pool's
measured throughput and configured cost. Rules:

Every change is `step` replicas of one pool (`autoscaling.step`: a data-parallel group's worth;
1 by default), and "one more" / "one fewer" below means a step's worth.

- scale up by one when generation is the bottleneck (Δ = T_gen − T_train > 0) and the
  generators would still be busy at least `min_utilisation` of the time with one more:
  T_gen − Δ′ ≥ min_utilisation · T_train, where Δ′ is the generation time one more
  replica saves, estimated from measured per-replica throughput (a replica of pool q
  turns total throughput R into R + r_q, so T_gen shrinks by T_gen · r_q / (R + r_q)).
  With min_utilisation = 1 this is the published rule, Δ > Δ′: never add a replica that
  would sit partly idle; lower values trade replica-seconds for a smaller pipeline
  bubble. The pool is the one with the best throughput per cost that still has room;
- scale down by one only on spare capacity, the add rule's mirror image with a margin, so
  the next round does not add the replica back: one replica fewer would keep generation
  within (1 − `hysteresis`) of training's time, or generators sit idle for lack of work
  beyond `idle_threshold` — idle while the iteration's work was out, not at the barrier
  where the trainer steps and publishes and every generator must wait — and one replica
  fewer would still keep generation within training's time. Never while any of the last
  GENERATION_BOUND_MEMORY observations was generation-bound. The pool is the one with the
  worst throughput per cost above its minimum;
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
    """Fraction of generator time idle for lack of work while the iteration's work was out,
    recent (the barrier, when no work was pending or out anywhere, excluded): spare capacity."""

    @property
    def generation_bound(self) -> bool:
        return self.generation_s > self.train_s


@dataclass(frozen=True)
class State:
    """What the policy remembers between calls."""

    recommendations: tuple[tuple[float, int], ...] = ()
    """(time, recommended direction: +1, 0 or -1) over the last two horizons (windows, periods)."""
    actions: tuple[tuple[float, int], ...] = ()
    """(time, replicas added (> 0) or removed (< 0)) within the longest policy period."""
    generation_bound: tuple[bool, ...] = ()
    """Whether each of the last GENERATION_BOUND_MEMORY observations was generation-bound."""


GENERATION_BOUND_MEMORY = 3
"""Observations remembered: no replica is removed while any of them was generation-bound."""


@dataclass(frozen=True)
class Decision:
    replicas: dict[str, int]
    """Desired replicas per pool."""
    reason: str
    """Why, for a person (events, status, logs)."""
    step: int = 0
    """Replicas added (> 0) or removed (< 0): +-autoscaling.step, or 0."""
    pool: str | None = None
    """The pool that changed."""
    trainer_bound: bool = False
    """Training is the bottleneck and generators are at their minimum."""
    state: State = field(default_factory=State)


def _saving(obs: Observation, pools: list[Pool], pool: Pool, step: int = 1) -> float:
    """Generation seconds per iteration `step` more replicas of `pool` would save."""
    total = sum(p.replicas * p.samples_per_s for p in pools)
    if total <= 0 or pool.samples_per_s <= 0:
        return 0.0
    return obs.generation_s * step * pool.samples_per_s / (total + step * pool.samples_per_s)


def _after_removal(obs: Observation, pools: list[Pool], pool: Pool, step: int = 1) -> float:
    """Generation seconds per iteration with `step` replicas of `pool` fewer."""
    total = sum(p.replicas * p.samples_per_s for p in pools)
    rest = total - step * pool.samples_per_s
    return obs.generation_s * total / rest if rest > 0 else float("inf")


def _more(step: int, pool: str = "") -> str:
    """`one more gpu replica`, `4 more replicas`."""
    name = f"{pool} " if pool else ""
    return f"one more {name}replica" if step == 1 else f"{step} more {name}replicas"


def _fewer(step: int, pool: str = "") -> str:
    """`one gpu replica fewer`, `4 replicas fewer`."""
    name = f"{pool} " if pool else ""
    return f"one {name}replica fewer" if step == 1 else f"{step} {name}replicas fewer"


def recommend(obs: Observation, pools: list[Pool], idle_threshold: float = 0.2, min_utilisation: float = 1.0,
              hysteresis: float = 0.1, recently_generation_bound: bool = False,
              step: int = 1) -> tuple[int, Pool | None, str, bool]:
    """The rule's raw answer: (direction +1/0/-1, pool, reason, trainer_bound), before windows
    and policies; a change is `step` replicas."""
    delta = obs.generation_s - obs.train_s
    growable = sorted((p for p in pools if p.replicas + step <= p.max_replicas and p.samples_per_s > 0),
                      key=lambda p: (-p.value, p.name))
    # Never the job's last replicas, whatever the minimums say: nothing would generate.
    last = sum(p.replicas for p in pools) <= step
    shrinkable = sorted((p for p in pools if p.replicas - step >= p.min_replicas and p.samples_per_s > 0 and not last),
                        key=lambda p: (p.value, p.name))
    if delta > 0 and growable:
        best = growable[0]
        saving = _saving(obs, pools, best, step)
        after = obs.generation_s - saving
        if after >= min_utilisation * obs.train_s:
            return (1, best, f"generation-bound: generation {obs.generation_s:.2f}s - training {obs.train_s:.2f}s "
                             f"= {delta:.2f}s per iteration; {_more(step, best.name)} save{'s' * (step == 1)} "
                             f"{saving:.2f}s and generation ({after:.2f}s) stays >= {min_utilisation:.0%} of training",
                    False)
        return (0, None, f"balanced: {_more(step)} would save "
                         f"{saving:.2f}s, leaving generation ({after:.2f}s) under {min_utilisation:.0%} of training "
                         f"({obs.train_s:.2f}s)", False)
    if delta > 0:
        return 0, None, "generation-bound, but every pool is at its maximum", False
    if shrinkable:
        if recently_generation_bound:
            return (0, None, f"keeping every replica: generation was the bottleneck within the last "
                             f"{GENERATION_BOUND_MEMORY} observations", False)
        worst = shrinkable[0]
        after = _after_removal(obs, pools, worst, step)
        if after <= (1 - hysteresis) * obs.train_s:
            return (-1, worst, f"training-bound: with {_fewer(step, worst.name)} generation would take "
                               f"{after:.2f}s, within {1 - hysteresis:.0%} of training's {obs.train_s:.2f}s", False)
        if obs.idle_no_work > idle_threshold and after <= obs.train_s:
            return (-1, worst, f"generators idle for lack of work {obs.idle_no_work:.0%} of the time while work "
                               f"was out (> {idle_threshold:.0%}); with {_fewer(step, worst.name)} generation "
                               f"would take {after:.2f}s, still within training's {obs.train_s:.2f}s", False)
        return (0, None, f"balanced: {_fewer(step)} would bring generation "
                         f"({after:.2f}s) too close to training ({obs.train_s:.2f}s) to hold", False)
    bound = delta < 0
    return (0, None, "training-bound and every pool is at its minimum: the trainer is the bottleneck"
            if bound else "balanced", bound)


def decide(obs: Observation, pools: list[Pool], behavior: Behavior, state: State, now: float,
           idle_threshold: float = 0.2, min_utilisation: float = 1.0, hysteresis: float = 0.1,
           size: int = 1) -> Decision:
    """Apply the rule, then the stabilization windows and rate policies; a change is `size`
    replicas (autoscaling.step)."""
    current = {p.name: p.replicas for p in pools}
    step, pool, reason, bound = recommend(obs, pools, idle_threshold, min_utilisation, hysteresis,
                                          any(state.generation_bound), size)
    remembered = (*state.generation_bound, obs.generation_bound)[-GENERATION_BOUND_MEMORY:]
    horizon = max([behavior.scale_up.stabilization_window_seconds, behavior.scale_down.stabilization_window_seconds,
                   behavior.cooldown_seconds]
                  + [p.period_seconds for r in (behavior.scale_up, behavior.scale_down) for p in r.policies])
    # Twice the horizon: a window is covered once some recommendation predates its start.
    recs = tuple((t, s) for t, s in state.recommendations if t > now - 2 * horizon) + ((now, step),)
    actions = tuple((t, d) for t, d in state.actions if t > now - horizon)
    new_state = replace(state, recommendations=recs, actions=actions, generation_bound=remembered)
    if step == 0:
        return Decision(current, reason, trainer_bound=bound, state=new_state)
    assert pool is not None  # recommend names the pool of a step
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
        if moved + size > policy.value:
            return Decision(current, f"{reason}; held: at most {policy.value} per {policy.period_seconds:.0f}s",
                            state=new_state)
    desired = dict(current)
    desired[pool.name] += step * size
    return Decision(desired, reason, step * size, pool.name, False,
                    replace(new_state, actions=actions + ((now, step * size),)))


def behavior_from_spec(spec) -> Behavior:
    """The policy's behaviour from `spec.autoscaling.behavior` (an AutoscalingSpec's)."""
    def value(p) -> int:  # one left unset allows a step
        return p.value if "value" in p.model_fields_set else max(p.value, spec.step)

    def rules(r) -> ScalingRules:
        return ScalingRules(float(r.stabilization_window_seconds),
                            tuple(ScalingPolicy(value(p), float(p.period_seconds)) for p in r.policies))

    return Behavior(rules(spec.behavior.scale_up), rules(spec.behavior.scale_down), float(spec.cooldown_seconds))


def pools_from_spec(generators, replicas: dict[str, int], samples_per_s: dict[str, float]) -> list[Pool]:
    """The policy's view of the pools: bounds and cost from the spec, current replicas and
    measured per-replica throughput from the run."""
    return [Pool(p.name, replicas.get(p.name, 0), p.min_replicas,
                 p.max_replicas if p.max_replicas is not None else max(p.replicas, replicas.get(p.name, 0)),
                 samples_per_s.get(p.name, 0.0), p.cost)
            for p in generators.pools]


def count_reversals(changes: list[tuple[float, int]], window_s: float) -> int:
    """How many changes (time, step) were undone within `window_s`: a change followed by one
    in the opposite direction that soon (add -> remove -> add counts two)."""
    ordered = sorted((t, s) for t, s in changes if s)
    return sum(1 for (t0, s0), (t1, s1) in zip(ordered, ordered[1:]) if (s0 > 0) != (s1 > 0) and t1 - t0 <= window_s)


def count_flaps(changes: list[tuple[float, int]], window_s: float) -> int:
    """How many times the replicas went there and back again within `window_s`: a change,
    its reversal, then the first change once more (add -> remove -> add). Unlike a single
    reversal, which a workload that really changed may call for, a flap is never right."""
    ordered = sorted((t, s) for t, s in changes if s)
    return sum(1 for (t0, s0), (_, s1), (t2, s2) in zip(ordered, ordered[1:], ordered[2:])
               if (s0 > 0) == (s2 > 0) != (s1 > 0) and t2 - t0 <= window_s)
