import pytest

from streamrl.trainer.longtail import (
    LatencyProfile,
    LongTailDemand,
    ReplicaProfile,
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
    slowest = plan_long_tail(LongTailDemand(16, 112, 80, 10), _replicas(2), 8, "max")
    assert slowest.estimates_s == pytest.approx((5.92, 2.88, 11.52))


def test_sum_and_max_objectives_can_disagree():
    # 4 replicas, 32 long samples (L 80), 224 regular (L 30), cap 8.
    # N_long: 0 -> 5.92; 1 -> long 5.76 + reg 4.44; 2 -> 2.88 + 4.44; 3 -> 2.88 + 8.88; 4 -> 11.52
    total = plan_long_tail(LongTailDemand(32, 224, 80, 30), _replicas(4), 8, "sum")
    assert total.estimates_s == pytest.approx((5.92, 10.20, 7.32, 11.76, 11.52))
    assert total.long_replicas == ()
    slowest = plan_long_tail(LongTailDemand(32, 224, 80, 30), _replicas(4), 8, "max")
    assert slowest.estimates_s == pytest.approx((5.92, 5.76, 4.44, 8.88, 11.52))
    assert len(slowest.long_replicas) == 2


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
