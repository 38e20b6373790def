"""The policy replayed over recorded round sequences: no replica is removed while the recent
rounds were generation-bound, nothing is reversed inside the hysteresis band, and true spare
capacity is removed. A decision and its reversal within a few rounds is a defect."""

from __future__ import annotations

import math

import pytest

from streamrl.scaling.policy import (
    Decision,
    Observation,
    Pool,
    State,
    behavior_from_spec,
    count_flaps,
    count_reversals,
    decide,
)
from streamrl.spec import parse_job

REVERSAL_WINDOW_S = 30.0
"""A change undone within this long is a flap (bench/elastic.py's rounds are one second)."""


def _autoscaling(**over):
    """bench/elastic.py's elastic configuration."""
    return parse_job({"spec": {"model": {"source": "builtin-tiny"}, "autoscaling": {
        "mode": "Internal", "intervalSeconds": 1, "minUtilisation": 0.5, "cooldownSeconds": 10, **over,
        "behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 2}]},
                     "scaleDown": {"stabilizationWindowSeconds": 5,
                                   "policies": [{"type": "Pods", "value": 1, "periodSeconds": 5}]}}}}}).spec.autoscaling


def replay(rounds, replicas: int = 1, max_replicas: int = 2, samples_per_s: float = 60.0, **spec) -> list[Decision]:
    """Feed the policy each round's observation (None: a round that waited, e.g. while a
    replica joined), recorded, or made by a function of the replicas at that time; a decided
    change takes effect for the next round."""
    auto = _autoscaling(**spec)
    state, decisions = State(), []
    for now, obs in rounds:
        if callable(obs):
            obs = obs(replicas)
        if obs is None:
            continue
        pools = [Pool("default", replicas, 1, max_replicas, samples_per_s)]
        d = decide(obs, pools, behavior_from_spec(auto), state, now, auto.idle_threshold, auto.min_utilisation,
                   auto.hysteresis)
        decisions.append(d)
        state, replicas = d.state, replicas + d.step
    return decisions


def _changes(decisions: list[Decision], rounds) -> list[tuple[float, int]]:
    times = [t for t, obs in rounds if obs is not None]  # (a function always observes)
    return [(t, d.step) for t, d in zip(times, decisions) if d.step]


# The round that made bench/elastic.py flap (issue 15): generation-bound at one replica, a
# second one added; while it joined (9 s on busy cores) no round decided; then the barrier
# idle of stream-async (every generator waiting while the trainer steps) read as 23% idle
# and the old rule removed the replica; generation-bound again three rounds later.
FLAPPED = [
    (6.3, Observation(0.40, 0.22)), (7.3, Observation(0.41, 0.23)), (8.3, Observation(0.42, 0.23)),
    *[(float(t), None) for t in range(9, 19)],
    # Two replicas: generation 0.27 s against training's 0.33 s; the generators' no-work idle
    # is barrier idle (the new input takes the barrier off: 2% left while work was out).
    (19.8, Observation(0.27, 0.33, idle_no_work=0.02)), (20.8, Observation(0.28, 0.34, idle_no_work=0.03)),
    (21.8, Observation(0.27, 0.35, idle_no_work=0.02)), (22.8, Observation(0.30, 0.36, idle_no_work=0.02)),
    *[(t + 0.8, Observation(0.29 + 0.02 * (t % 2), 0.36, idle_no_work=0.02)) for t in range(23, 28)],
    (28.8, Observation(1.09, 0.47)), (29.8, Observation(1.20, 0.52)), (30.8, Observation(1.36, 0.58)),
]


def test_the_recorded_flap_does_not_happen_any_more():
    decisions = replay(FLAPPED)
    assert [s for _, s in _changes(decisions, FLAPPED)] == [1]  # the one scale-up, kept
    assert count_reversals(_changes(decisions, FLAPPED), REVERSAL_WINDOW_S) == 0
    assert count_flaps([(6.3, 1), (19.8, -1), (29.8, 1)], REVERSAL_WINDOW_S) == 1  # what the old rule did
    # Whatever the idle reads: with one fewer, generation (2 x 0.27 s) would take longer than
    # training (0.35 s), so the replica is not spare.
    barrier_counted = [(t, Observation(o.generation_s, o.train_s, 0.23) if o and o.train_s > o.generation_s else o)
                       for t, o in FLAPPED]
    assert [s for _, s in _changes(replay(barrier_counted), barrier_counted)] == [1]


def test_no_removal_while_generation_was_bound_in_the_recent_rounds():
    # Generation-bound with both replicas at the maximum, then one round that looks idle.
    rounds = [(float(t), Observation(1.0, 0.5)) for t in range(30, 34)] + [(34.0, Observation(0.2, 0.5, 0.9))]
    decisions = replay(rounds, replicas=2, cooldownSeconds=0)
    assert all(d.step == 0 for d in decisions)
    assert "generation was the bottleneck within the last 3 observations" in decisions[-1].reason


def _workload(one_replica_s: float, train_s: float, jitter: float, t: int):
    """Generation takes one_replica_s / replicas, read with a +-jitter drift over 20 rounds
    (slow enough to outlast the scale-down stabilization window)."""
    return lambda replicas: Observation(one_replica_s / replicas * (1 + jitter * math.sin(t * math.pi / 10)), train_s)


@pytest.mark.parametrize("jitter", [0.0, 0.02, 0.04])
def test_noise_inside_the_hysteresis_band_reverses_nothing(jitter):
    # Balanced near the line: one replica would generate in 0.49 s against training's 0.50 s.
    # Read with a 4% drift, the old rule (remove when one fewer stays within training's time)
    # removed the second replica on the low stretch, and the high stretch at one replica
    # (0.51 s > 0.50 s) added it back: a flap every cycle.
    rounds = [(float(t), _workload(0.49, 0.50, jitter, t)) for t in range(60)]
    decisions = replay(rounds, replicas=2, cooldownSeconds=0)
    changes = _changes(decisions, rounds)
    assert changes == [] and count_reversals(changes, REVERSAL_WINDOW_S) == 0


def test_true_spare_capacity_is_removed_and_stays_removed():
    # The workload shrank: one replica generates in 0.30 s, far within training's 0.50 s.
    # Replicas go one at a time (each after the scale-down window) down to one, and none
    # comes back.
    rounds = [(float(t), _workload(0.30, 0.50, 0.0, t)) for t in range(40)]
    decisions = replay(rounds, replicas=3, max_replicas=3, cooldownSeconds=0)
    changes = _changes(decisions, rounds)
    assert [s for _, s in changes] == [-1, -1]  # 3 -> 2 -> 1, the minimum
    assert decisions[-1].replicas == {"default": 1} and count_reversals(changes, REVERSAL_WINDOW_S) == 0
    assert decisions[-1].trainer_bound


def test_idle_while_work_was_out_removes_a_replica_the_times_alone_would_keep():
    # Inside the band by the times (2 x 0.24 s = 0.48 s, within training's 0.50 s but not
    # within 90% of it), but generators idle 40% of the time while work was out.
    rounds = [(float(t), Observation(0.24, 0.50, idle_no_work=0.4)) for t in range(12)]
    changes = _changes(replay(rounds, replicas=2, cooldownSeconds=0), rounds)
    assert [s for _, s in changes] == [-1]


def test_reversals_and_flaps_are_counted_within_the_window():
    assert count_flaps([(0, 1), (5, -1), (8, 1)], 10) == 1
    assert count_flaps([(0, 1), (5, 1), (25, -1)], 30) == 0  # a workload that changed: one reversal, no flap
    assert count_flaps([(0, 1), (5, -1), (80, 1)], 30) == 0
    assert count_reversals([(0, 1), (5, -1), (8, 1)], 10) == 2
    assert count_reversals([(0, 1), (5, 1), (8, 1)], 10) == 0
    assert count_reversals([(0, 1), (50, -1)], 10) == 0
    assert count_reversals([(0, 0), (1, 1), (2, 0), (3, -1)], 10) == 1
