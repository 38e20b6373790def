import pytest

from streamrl.rollout.longtail import (
    LatencyProfile,
    LongTailDemand,
    ReplicaProfile,
    batched_time,
    group_time,
    length_targets,
    plan_long_tail,
    split_long_tail,
)

# PTL(bs) = 0.01 + 0.001 * bs seconds per decode step: PTL(8) = 0.018, PTL(64) = 0.074.
LINEAR = LatencyProfile(((1, 0.011), (64, 0.074)))


def _replicas(n, profile=LINEAR, max_batch=64):
    return [ReplicaProfile(f"r{i}", profile, max_batch) for i in range(n)]


def test_latency_profile_interpolates_and_extrapolates():
    assert LINEAR.ptl(8) == pytest.approx(0.018)
    assert LINEAR.ptl(64) == pytest.approx(0.074)
    assert LINEAR.ptl(128) == pytest.approx(0.138)
    p = LatencyProfile(((8, 0.02), (1, 0.01), (32, 0.05)))
    assert p.points[0] == (1, 0.01)
    assert p.ptl(4) == pytest.approx(0.01 + 0.01 * 3 / 7)
    assert p.ptl(16) == pytest.approx(0.02 + 0.03 * 8 / 24)
    with pytest.raises(ValueError, match="at least one"):
        LatencyProfile(())


def test_group_time_by_hand():
    # 112 samples on one replica at cap 64: two rounds of 64 at PTL(64), 10 tokens each.
    assert group_time(LINEAR, 112, 1, 10, 64) == pytest.approx(0.074 * 10 * 2)
    # 16 samples on one replica capped at 8: two rounds at PTL(8), 80 tokens.
    assert group_time(LINEAR, 16, 1, 80, 8) == pytest.approx(0.018 * 80 * 2)
    assert group_time(LINEAR, 0, 0, 80, 8) == 0.0


def test_two_replicas_one_for_the_long_tail():
    # 2 long prompts x 8 samples and 14 regular prompts x 8; L_long 80, L_reg 10, cap 8.
    # N_long=0: 64 per replica at bs 64 paced by the long ones: 0.074*80 = 5.92
    # N_long=1: long 0.018*80*2 = 2.88, regular 0.074*10*2 = 1.48 -> sum 4.36, max 2.88
    # N_long=2: 64 per replica at bs 8: 0.018*80*8 = 11.52
    plan = plan_long_tail(LongTailDemand(16, 112, 80, 10), _replicas(2), 8, "sum")
    assert plan.estimates_s == pytest.approx((5.92, 4.36, 11.52))
    assert (plan.long_replicas, plan.regular_replicas) == (("r0",), ("r1",))
    assert plan.estimated_s == pytest.approx(4.36)
    # max, by batched_time (mean length over all 128: (16*80 + 112*10) / 128 = 18.75):
    # N_long=0: 64 per replica at bs 64, steps max(80, 64*18.75/64) = 80: 5.92
    # N_long=1: long 0.018 * max(80, 16*80/8 = 160) = 2.88, regular 0.074 * max(10, 112*10/64) = 1.295
    # N_long=2: 64 per replica at bs 8, steps max(80, 64*18.75/8 = 150): 0.018*150 = 2.7
    slowest = plan_long_tail(LongTailDemand(16, 112, 80, 10), _replicas(2), 8, "max")
    assert slowest.estimates_s == pytest.approx((5.92, 2.88, 2.7))
    assert slowest.long_replicas == ("r0", "r1")


def test_sum_and_max_objectives_can_disagree():
    # 4 replicas, 32 long samples (L 80), 224 regular (L 30), cap 8.
    # N_long: 0 -> 5.92; 1 -> long 5.76 + reg 4.44; 2 -> 2.88 + 4.44; 3 -> 2.88 + 8.88; 4 -> 11.52
    total = plan_long_tail(LongTailDemand(32, 224, 80, 30), _replicas(4), 8, "sum")
    assert total.estimates_s == pytest.approx((5.92, 10.20, 7.32, 11.76, 11.52))
    assert total.long_replicas == ()
    # max (mean over all 256: 36.25): 0 -> 0.074*80; 1 -> long 0.018*max(80, 32*80/8), regular 75 per replica
    # 0.074*max(30, 75*30/64); 2 -> long 0.018*160, regular 0.074*max(30, 112*30/64 = 52.5);
    # 3 -> long 0.018*max(80, 11*80/8), regular 0.074*(224*30/64); 4 -> 0.018*max(80, 64*36.25/8 = 290)
    slowest = plan_long_tail(LongTailDemand(32, 224, 80, 30), _replicas(4), 8, "max")
    assert slowest.estimates_s == pytest.approx((5.92, 5.76, 0.074 * 52.5, 0.074 * 105, 0.018 * 290))
    assert len(slowest.long_replicas) == 2


def test_batched_time_by_hand():
    # 112 samples of mean 10 on one replica at cap 64: 112*10/64 = 17.5 steps at PTL(64), more than the longest 10.
    assert batched_time(LINEAR, 112, 1, 10, 10, 64) == pytest.approx(0.074 * 17.5)
    # 4 samples: batch 4 at PTL(4); the longest (50) paces it, not 4*20/4 = 20 steps.
    assert batched_time(LINEAR, 4, 1, 20, 50, 64) == pytest.approx(LINEAR.ptl(4) * 50)
    assert batched_time(LINEAR, 0, 0, 10, 10, 8) == 0.0
    assert batched_time(LINEAR, 3, 0, 10, 10, 8) == float("inf")


def test_max_keeps_a_mixed_batch_whole_where_the_long_group_would_be_slower():
    # A plan two CPU replicas' reports led to in bench/skew.py: PTL (ms) 1.24 at 8 and 4.16 at
    # 64 (the replica sharing the trainer's core), 1.38 and 3.29 (the other); 104 long samples
    # (P90 36 tokens), 408 regular (P50 9). Its long group took 1.1 s against 0.4 s unsplit.
    shared = ReplicaProfile("shared", LatencyProfile(((8, 0.00124), (64, 0.00416))), 64)
    alone = ReplicaProfile("alone", LatencyProfile(((8, 0.00138), (64, 0.00329))), 64)
    demand = LongTailDemand(104, 408, 36, 9)
    # group_time charges every wave of the unsplit full batch the long samples' 36 tokens,
    # which puts not splitting above the long-tail group alone:
    assert group_time(shared.profile, 512, 2, 36, 64) == pytest.approx(0.00416 * 36 * 4)
    assert group_time(shared.profile, 104, 1, 36, 8) == pytest.approx(0.00124 * 36 * 13)
    assert group_time(shared.profile, 512, 2, 36, 64) > group_time(shared.profile, 104, 1, 36, 8)
    # continuous batching runs it in max(36, 256 * 14.46 / 64) steps instead: no split.
    plan = plan_long_tail(demand, [shared, alone], 8, "max")
    assert plan.long_replicas == ()
    assert plan.estimates_s[0] == pytest.approx(0.00416 * 256 * (104 * 36 + 408 * 9) / 512 / 64)
    assert plan.estimates_s[1] == pytest.approx(0.00124 * 104 * 36 / 8)


def test_long_tail_goes_to_the_replicas_fastest_at_small_batches():
    slow = LatencyProfile(((1, 0.03), (64, 0.09)))
    replicas = [ReplicaProfile("slow", slow, 64), ReplicaProfile("fast", LINEAR, 64)]
    plan = plan_long_tail(LongTailDemand(16, 112, 80, 10), replicas, 8, "max")
    assert plan.long_replicas == ("fast",)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="no replicas"):
        plan_long_tail(LongTailDemand(1, 1, 10, 5), [], 8)
    with pytest.raises(ValueError, match="expected 'sum' or 'max'"):
        plan_long_tail(LongTailDemand(1, 1, 10, 5), _replicas(1), 8, "min")


def test_split_long_tail_and_length_targets():
    assert split_long_tail({"a": 10, "b": 50, "c": 30, "d": 5, "e": 40}, 0.4) == (["b", "e"], ["c", "a", "d"])
    with pytest.raises(ValueError, match="alpha"):
        split_long_tail({"a": 1}, 1.5)
    assert length_targets(list(range(1, 11))) == pytest.approx((9.1, 5.5))


def test_four_replicas_follow_algorithm_2_and_set_one_aside_only_while_the_tail_fits_its_batch():
    """Algorithm 2 (objective sum) with 4 replicas, PTL 10 ms at 1, 12 ms at 8, 40 ms at 64;
    8 long samples of 1,000 tokens and 120 regular of 200, long-tail cap 8:
      0 long: 128 over 4 at 32, PTL(32) = 24 ms x 1,000 (the long ones set the pace) = 24.0 s
      1 long: 8 in one wave at PTL(8) x 1,000 = 12.0 s + 120 over 3 at 40, 28 ms x 200 = 5.6 s
      2 long: 4 each at 10.86 ms x 1,000 + 60 each at 38 ms x 200 = 10.86 + 7.6 s
      3 long: 3 each at 10.57 ms x 1,000 + 120 on one in 2 waves of 64 at 40 ms x 200 = 26.57 s
      4 long: 32 each in 4 waves of 8 at 12 ms x 1,000 = 48.0 s
    One replica goes to the tail. With five times the tail (40 samples, 5 waves on one replica
    at the cap) setting replicas aside costs more than letting them pace everyone: none."""
    profile = LatencyProfile(((1, 0.010), (8, 0.012), (64, 0.040)))
    plan = plan_long_tail(LongTailDemand(8, 120, 1000, 200), _replicas(4, profile), 8)
    assert plan.estimates_s == pytest.approx((24.0, 17.6, 10.0 + 6 / 7 + 7.6, 10.0 + 4 / 7 + 16.0, 48.0), rel=1e-3)
    assert len(plan.long_replicas) == 1
    heavy = plan_long_tail(LongTailDemand(40, 88, 1000, 200), _replicas(4, profile), 8)
    # 0 long: 128 over 4 at 32 = 24.0 s; 1 long: 5 waves x 12 s + 88 over 3 at 30 (23 ms) x 200 = 64.6 s
    assert heavy.estimates_s[0] == pytest.approx(24.0) and heavy.estimates_s[1] == pytest.approx(64.6)
    assert heavy.long_replicas == ()
