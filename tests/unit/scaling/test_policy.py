"""The scaling policy, rule by rule: numbers worked out by hand."""

from dataclasses import replace

import pytest

from streamrl.scaling.policy import Behavior, Observation, Pool, ScalingPolicy, ScalingRules, State, decide, recommend

NOW = 1000.0
FAST = Behavior(ScalingRules(0.0, (ScalingPolicy(1, 60.0),)), ScalingRules(0.0, (ScalingPolicy(1, 60.0),)))


def test_generation_bound_adds_one_replica_when_the_gap_exceeds_what_it_saves():
    # R = 2 x 5 = 10 samples/s; one more saves 10 s x 5 / 15 = 3.33 s < gap 6 s.
    step, pool, reason, _ = recommend(Observation(10.0, 4.0), [Pool("a", 2, samples_per_s=5.0)])
    assert (step, pool.name) == (1, "a")
    assert "6.00s per iteration; one more a replica saves 3.33s and generation (6.67s)" in reason
    # Gap 1 s < 5 s x 5 / 15 = 1.67 s: a third replica would idle part of the time.
    step, _, reason, _ = recommend(Observation(5.0, 4.0), [Pool("a", 2, samples_per_s=5.0)])
    assert step == 0 and "leaving generation (3.33s) under 100% of training" in reason


def test_a_lower_utilisation_floor_adds_a_replica_that_would_idle_part_of_the_time():
    pools = [Pool("a", 2, samples_per_s=5.0)]
    # With one more, generation takes 3.33 s against training's 4 s: 83% busy.
    assert recommend(Observation(5.0, 4.0), pools, min_utilisation=0.8)[0] == 1
    assert recommend(Observation(5.0, 4.0), pools, min_utilisation=0.9)[0] == 0
    # Never while training is the bottleneck, whatever the floor.
    assert recommend(Observation(3.9, 4.0), pools, min_utilisation=0.1)[0] != 1


def test_the_pool_with_the_best_throughput_per_cost_that_has_room_grows():
    pools = [Pool("a100", 1, samples_per_s=12.0, cost=4.0), Pool("l4", 2, max_replicas=3, samples_per_s=5.0, cost=1.0)]
    assert recommend(Observation(20.0, 2.0), pools)[1].name == "l4"  # 5/1 beats 12/4
    full = [pools[0], Pool("l4", 3, max_replicas=3, samples_per_s=5.0, cost=1.0)]
    assert recommend(Observation(20.0, 2.0), full)[1].name == "a100"
    at_max = [Pool("a100", 2, max_replicas=2, samples_per_s=12.0)]
    assert recommend(Observation(20.0, 2.0), at_max)[:2] == (0, None)


def test_spare_capacity_removes_the_least_valuable_replica_with_a_margin_against_the_add_rule():
    # 4 x 5/s -> 3 x 5/s makes generation 2 x 20/15 = 2.67 s, within 90% of training's 4 s.
    step, pool, reason, _ = recommend(Observation(2.0, 4.0), [Pool("l4", 4, samples_per_s=5.0)])
    assert (step, pool.name) == (-1, "l4") and "2.67s, within 90% of training" in reason
    # 2.8 x 20/15 = 3.73 s: under training's 4 s, but inside the 10% band: kept (noise could
    # make the next round generation-bound and add it back).
    step, _, reason, _ = recommend(Observation(2.8, 4.0), [Pool("l4", 4, samples_per_s=5.0)])
    assert step == 0 and "too close to training" in reason
    assert recommend(Observation(2.8, 4.0), [Pool("l4", 4, samples_per_s=5.0)], hysteresis=0.0)[0] == -1
    # 3.5 x 20/15 = 4.67 s > 4 s: keep them.
    assert recommend(Observation(3.5, 4.0), [Pool("l4", 4, samples_per_s=5.0)])[0] == 0
    # The least valuable pool goes first: a100 (12/s for 4) before l4 (5/s for 1).
    pools = [Pool("a100", 2, min_replicas=1, samples_per_s=12.0, cost=4.0), Pool("l4", 2, samples_per_s=5.0)]
    assert recommend(Observation(2.0, 4.0), pools)[1].name == "a100"


def test_idle_while_work_is_out_removes_a_replica_only_if_generation_stays_within_training():
    pools = [Pool("a100", 2, min_replicas=1, samples_per_s=12.0, cost=4.0), Pool("l4", 2, samples_per_s=5.0)]
    # Without the a100: 2.5 x 34/22 = 3.86 s, within training's 4 s but inside the band;
    # the generators' idle time while work was out says the capacity is spare.
    step, pool, reason, _ = recommend(Observation(2.5, 4.0, idle_no_work=0.5), pools)
    assert (step, pool.name) == (-1, "a100") and "idle for lack of work 50% of the time while work was out" in reason
    assert recommend(Observation(2.5, 4.0, idle_no_work=0.1), pools)[0] == 0  # under the threshold
    # However idle: one fewer would make generation (3 x 34/22 = 4.64 s) the bottleneck.
    assert recommend(Observation(3.0, 4.0, idle_no_work=0.9), pools)[0] == 0


def test_no_replica_is_removed_while_generation_was_recently_the_bottleneck():
    pools = [Pool("l4", 4, samples_per_s=5.0)]
    step, _, reason, _ = recommend(Observation(1.0, 4.0, idle_no_work=0.9), pools, recently_generation_bound=True)
    assert step == 0 and "generation was the bottleneck within the last 3 observations" in reason


def test_trainer_bound_at_the_minimum_is_said():
    step, _, reason, bound = recommend(Observation(2.0, 4.0), [Pool("l4", 1, min_replicas=1, samples_per_s=5.0)])
    assert (step, bound) == (0, True) and "trainer is the bottleneck" in reason


def test_unmeasured_pools_are_not_scaled():
    assert recommend(Observation(10.0, 1.0), [Pool("new", 1, samples_per_s=0.0)])[:2] == (0, None)


def test_decide_applies_the_step_and_respects_the_rate_policy():
    pools = [Pool("a", 2, samples_per_s=5.0)]
    first = decide(Observation(10.0, 4.0), pools, FAST, State(), NOW)
    assert (first.replicas, first.step, first.pool) == ({"a": 3}, 1, "a")
    grown = [Pool("a", 3, samples_per_s=5.0)]
    held = decide(Observation(10.0, 4.0), grown, FAST, first.state, NOW + 30)
    assert held.replicas == {"a": 3} and "at most 1 per 60s" in held.reason
    again = decide(Observation(10.0, 4.0), grown, FAST, held.state, NOW + 61)
    assert again.replicas == {"a": 4}


def test_scale_down_waits_for_its_stabilization_window():
    behavior = Behavior(FAST.scale_up, ScalingRules(300.0, (ScalingPolicy(1, 60.0),)))
    pools = [Pool("a", 4, samples_per_s=5.0)]
    obs = Observation(2.0, 4.0, idle_no_work=0.5)
    state = State()
    for t in (0, 100, 200):
        d = decide(obs, pools, behavior, state, NOW + t)
        assert d.replicas == {"a": 4} and "not yet stable for 300s" in d.reason
        state = d.state
    d = decide(obs, pools, behavior, state, NOW + 301)
    assert d.replicas == {"a": 3} and d.step == -1
    # A contrary recommendation inside the window blocks the next scale-down.
    busy = decide(Observation(10.0, 4.0), [Pool("a", 3, max_replicas=3, samples_per_s=5.0)], behavior, d.state,
                  NOW + 400)
    blocked = decide(obs, [Pool("a", 3, samples_per_s=5.0)], behavior, busy.state, NOW + 650)
    assert blocked.replicas == {"a": 3}


@pytest.mark.parametrize("replicas, minimum, expected", [(1, 1, 1), (2, 1, 1)])
def test_bounds(replicas, minimum, expected):
    d = decide(Observation(1.0, 4.0, idle_no_work=0.9), [Pool("a", replicas, min_replicas=minimum, samples_per_s=5.0)],
               FAST, State(), NOW)
    assert d.replicas == {"a": expected}


def test_policy_inputs_from_the_spec():
    from streamrl.scaling.policy import behavior_from_spec, pools_from_spec
    from streamrl.spec import parse_job

    job = parse_job({"spec": {
        "model": {"source": "builtin-tiny"},
        "generators": {"pools": [{"name": "l4", "replicas": 2, "minReplicas": 1, "maxReplicas": 6, "cost": 0.8},
                                 {"name": "a100", "replicas": 1, "cost": 3.0}]},
        "autoscaling": {"behavior": {
            "scaleUp": {"policies": [{"type": "Pods", "value": 2, "periodSeconds": 30}]},
            "scaleDown": {"stabilizationWindowSeconds": 120}}}}})
    behavior = behavior_from_spec(job.spec.autoscaling)
    assert behavior.scale_up == ScalingRules(0.0, (ScalingPolicy(2, 30.0),))
    assert behavior.scale_down == ScalingRules(120.0, (ScalingPolicy(1, 60.0),))
    pools = pools_from_spec(job.spec.generators, {"l4": 3, "a100": 1}, {"l4": 5.0})
    assert pools == [Pool("l4", 3, 1, 6, 5.0, 0.8), Pool("a100", 1, 0, 1, 0.0, 3.0)]


def _vec(value, **labels):
    return [{"metric": labels, "value": [NOW, str(value)]}]


def test_inputs_are_parsed_from_prometheus_result_vectors():
    from streamrl.scaling.inputs import parse_inputs

    results = {"iteration_s": _vec(8.0), "generator_utilisation": _vec(0.75), "trainer_utilisation": _vec(0.3125),
               "iterations": _vec(3), "idle_no_work": _vec(0.1),
               "pool_samples_per_s": _vec(40.0, pool="l4") + _vec("NaN", pool="a100"),
               "pool_connected": _vec(2, pool="l4") + _vec(0, pool="a100")}
    inputs = parse_inputs(results)
    assert inputs.observation == Observation(6.0, 2.5, 0.1)
    assert inputs.samples_per_s == {"l4": 40.0}  # 0/0 = no measurement, not zero
    assert inputs.connected == {"l4": 2, "a100": 0}
    # One iteration in the window may have begun before the last change: not enough.
    assert parse_inputs({**results, "iterations": _vec(1)}).observation is None
    # No idle series yet (a generator never idled) reads as 0, not as missing.
    assert parse_inputs({**results, "idle_no_work": []}).observation.idle_no_work == 0.0
    assert parse_inputs({**results, "iteration_s": []}).observation is None
    # Counters restarting can push a rate past 1 for a moment: a stage is at most always busy.
    assert parse_inputs({**results, "generator_utilisation": _vec(1.2)}).observation.generation_s == 8.0


def test_input_queries_select_the_job_and_the_window():
    from streamrl.scaling.inputs import input_queries

    queries = input_queries('my"job', 37.4)
    assert set(queries) == {"iteration_s", "generator_utilisation", "trainer_utilisation", "iterations",
                            "idle_no_work", "pool_samples_per_s", "pool_connected"}
    assert all('rljob="my\\"job"' in q for q in queries.values())
    assert "[37s]" in queries["iteration_s"] and "[2s]" in input_queries("j", 0.5)["trainer_utilisation"]


def test_a_pool_with_no_replica_is_assumed_as_fast_as_the_measured_ones():
    from streamrl.scaling.round import fill_unmeasured

    pools = fill_unmeasured([Pool("l4", 2, samples_per_s=4.0), Pool("a100", 0, max_replicas=2, cost=0.5),
                             Pool("h100", 1)])
    assert [p.samples_per_s for p in pools] == [4.0, 4.0, 0.0]  # a running, unmeasured pool stays unmeasured
    assert recommend(Observation(20.0, 2.0), pools)[1].name == "a100"  # cheaper per sample


def test_a_change_in_the_opposite_direction_waits_for_the_cooldown():
    behavior = Behavior(FAST.scale_up, FAST.scale_down, cooldown_seconds=30.0)
    up = decide(Observation(10.0, 4.0), [Pool("a", 2, samples_per_s=5.0)], behavior, State(), NOW)
    assert up.step == 1
    idle = Observation(2.0, 4.0, idle_no_work=0.5)
    # (The memory of generation-bound observations is cleared to see the cooldown alone.)
    up_state = replace(up.state, generation_bound=())
    held = decide(idle, [Pool("a", 3, samples_per_s=5.0)], behavior, up_state, NOW + 20)
    assert held.step == 0 and "cooling down: a replica was added 20s ago (cooldown 30s)" in held.reason
    down = decide(idle, [Pool("a", 3, samples_per_s=5.0)], behavior, held.state, NOW + 31)
    assert down.step == -1
    # The same direction is only rate-limited by its policies, not by the cooldown.
    again = decide(Observation(10.0, 4.0), [Pool("a", 3, samples_per_s=5.0)], behavior, up_state, NOW + 61)
    assert again.step == 1


def test_the_input_window_starts_when_the_replicas_settled_and_looks_back_four_rounds_at_most():
    from streamrl.scaling.inputs import input_window_s

    assert input_window_s(100.0, None, 15.0) is None  # replicas not settled (a change is joining)
    assert input_window_s(100.0, 80.0, 15.0) is None  # 20 s < two rounds: would predate the change
    assert input_window_s(100.0, 70.0, 15.0) == 30.0
    assert input_window_s(1000.0, 70.0, 15.0) == 60.0  # recent enough to follow the workload


def test_the_last_replica_is_never_removed_even_with_a_minimum_of_zero():
    step, _, reason, bound = recommend(Observation(1.0, 4.0, idle_no_work=0.9), [Pool("a", 1, min_replicas=0,
                                                                                       samples_per_s=5.0)])
    assert step == 0 and bound and "trainer is the bottleneck" in reason


def test_a_step_of_several_replicas_is_weighed_and_taken_whole():
    """autoscaling.step 4: 4 replicas of 1 sample/s each, generation 20 s, training 10 s. Four
    more save 20 x 4 / 8 = 10 s, leaving generation at training's 10 s: add all four (one at a
    time, the first would save 4 s)."""
    four = Behavior(ScalingRules(0.0, (ScalingPolicy(4, 60.0),)), ScalingRules(0.0, (ScalingPolicy(4, 60.0),)))
    pools = [Pool("a", 4, max_replicas=16, samples_per_s=1.0)]
    grown = decide(Observation(20.0, 10.0), pools, four, State(), NOW, size=4)
    assert (grown.replicas, grown.step) == ({"a": 8}, 4)
    assert "4 more a replicas save 10.00s and generation (10.00s)" in grown.reason
    assert decide(Observation(20.0, 10.0), pools, four, State(), NOW).replicas == {"a": 5}
    # Room for fewer than a step is no room: 13 of at most 16.
    full = decide(Observation(20.0, 10.0), [Pool("a", 13, max_replicas=16, samples_per_s=1.0)], four, State(), NOW,
                  size=4)
    assert full.step == 0 and "every pool is at its maximum" in full.reason
    # Training-bound: 8 replicas, generation 4 s of training's 10 s; 4 fewer would take 8 s <= 9 s.
    shrunk = decide(Observation(4.0, 10.0), [Pool("a", 8, samples_per_s=1.0)], four, State(), NOW, size=4)
    assert (shrunk.replicas, shrunk.step) == ({"a": 4}, -4)
    assert "with 4 a replicas fewer generation would take 8.00s" in shrunk.reason
    # A step below the minimum is not taken: 6 replicas, at least 4.
    kept = decide(Observation(4.0, 10.0), [Pool("a", 6, min_replicas=4, samples_per_s=1.0)], four, State(), NOW,
                  size=4)
    assert kept.step == 0 and kept.trainer_bound
    # The rate policy counts replicas: at most 4 per 60 s holds a second step of 4.
    held = decide(Observation(20.0, 10.0), [Pool("a", 8, max_replicas=16, samples_per_s=1.0)], four, grown.state,
                  NOW + 30, size=4)
    assert held.step == 0 and "at most 4 per 60s" in held.reason


def test_a_step_needs_rate_policies_that_allow_it():
    from streamrl.scaling.policy import behavior_from_spec
    from streamrl.spec import AutoscalingSpec

    spec = AutoscalingSpec.model_validate({"step": 4})  # policies left unset allow a step
    behavior = behavior_from_spec(spec)
    assert behavior.scale_up.policies == (ScalingPolicy(4, 60.0),) == behavior.scale_down.policies
    with pytest.raises(ValueError, match=r"behavior.scaleUp.policies\[0\].value: 2 replicas per period is below "
                                         r"step 4, so no step could ever be taken"):
        AutoscalingSpec.model_validate({"step": 4, "behavior": {"scaleUp": {"policies": [{"value": 2}]}}})
