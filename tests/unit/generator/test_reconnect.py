"""The backoff between a generator's attempts to reach its trainer again: each wait within
its doubling cap and never past the give-up deadline, drawn at random (full jitter), and
none once the deadline has passed; without a deadline, waits for ever."""

from __future__ import annotations

import random

import pytest

from streamrl.generator.reconnect import Backoff
from streamrl.spec import ReconnectSpec

SPEC = ReconnectSpec(initial_backoff_seconds=0.5, max_backoff_seconds=4.0, give_up_after_seconds=60.0)


def test_caps_double_from_the_initial_wait_up_to_the_maximum():
    backoff = Backoff(SPEC, broke_at=0.0)
    assert [backoff.cap(n) for n in range(7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert backoff.cap(10_000) == 4.0  # no overflow however long it tries


def test_each_wait_lies_within_its_cap_and_the_waits_are_jittered():
    backoff = Backoff(SPEC, broke_at=0.0, rng=random.Random(7))
    waits = [backoff.next_wait(now=1.0) for _ in range(200)]
    caps = [backoff.cap(n) for n in range(200)]
    assert all(0.0 <= w <= c for w, c in zip(waits, caps, strict=True))
    assert backoff.attempts == 200
    late = waits[3:]  # all under the 4 s cap: full jitter spreads them over [0, 4]
    assert len({round(w, 6) for w in late}) == len(late)
    assert min(late) < 1.0 and max(late) > 3.0
    assert 1.5 < sum(late) / len(late) < 2.5  # uniform on [0, 4]: mean 2


def test_two_replicas_with_their_own_randomness_do_not_retry_in_step():
    a, b = Backoff(SPEC, 0.0, random.Random(1)), Backoff(SPEC, 0.0, random.Random(2))
    assert [a.next_wait(0.0) for _ in range(5)] != [b.next_wait(0.0) for _ in range(5)]


def test_no_wait_runs_past_the_give_up_deadline_and_none_is_given_after_it():
    spec = ReconnectSpec(initial_backoff_seconds=5.0, max_backoff_seconds=10.0, give_up_after_seconds=12.0)

    class _AlwaysMax(random.Random):
        def uniform(self, a, b):
            return b

    backoff = Backoff(spec, broke_at=100.0, rng=_AlwaysMax())
    assert backoff.next_wait(100.0) == 5.0
    assert backoff.next_wait(105.0) == 7.0  # its cap is 10 s; only 7 s are left
    assert backoff.next_wait(112.0) is None
    assert backoff.next_wait(500.0) is None
    assert backoff.attempts == 2


def test_without_a_give_up_bound_it_waits_for_ever_within_its_cap():
    backoff = Backoff(ReconnectSpec(max_backoff_seconds=4.0), broke_at=0.0, rng=random.Random(3))
    waits = [backoff.next_wait(now=86400.0 * 30) for _ in range(50)]  # a month after the break
    assert None not in waits and all(0.0 <= w <= 4.0 for w in waits) and backoff.attempts == 50


def test_zero_give_up_means_never_reconnect():
    backoff = Backoff(ReconnectSpec(give_up_after_seconds=0), broke_at=10.0)
    assert backoff.next_wait(10.0) is None


def test_the_spec_refuses_a_maximum_below_the_initial_wait():
    with pytest.raises(ValueError, match="maxBackoffSeconds"):
        ReconnectSpec(initial_backoff_seconds=5.0, max_backoff_seconds=1.0)
