"""The learner's cost per micro-batch as `streamrl profile` fits it: a fixed part and seconds per
padded token, from single micro-batches of several shapes; never negative."""

import pytest

from streamrl.latency import fit_fixed_plus_per_unit


def test_the_fit_recovers_a_fixed_cost_and_a_per_token_slope():
    points = [(tokens, 0.003 + 4e-5 * tokens) for tokens in (184, 736, 3328)]
    assert fit_fixed_plus_per_unit(points) == pytest.approx((0.003, 4e-5))


def test_a_negative_intercept_is_refitted_through_the_origin():
    per_micro_batch, per_token = fit_fixed_plus_per_unit([(100, 0.001), (200, 0.0030)])
    assert per_micro_batch == 0.0
    # through the origin on relative error: sum(x / y) / sum(x² / y²)
    assert per_token == pytest.approx((100 / 0.001 + 200 / 0.003) / ((100 / 0.001) ** 2 + (200 / 0.003) ** 2))


def test_the_largest_sizes_noise_does_not_decide_the_fixed_cost():
    # An engine's admitting steps: 1.2 ms + 15 us per prompt token at 16, 64, 256 and 1024 tokens,
    # the largest measured 30% slow. Plain least squares puts the fixed part at 0.68 ms; on
    # relative error it is 1.10 ms.
    points = [(n, 0.0012 + 15e-6 * n) for n in (16, 64, 256)] + [(1024, 1.3 * (0.0012 + 15e-6 * 1024))]
    fixed, per_token = fit_fixed_plus_per_unit(points)
    assert fixed == pytest.approx(0.0012, abs=0.00015)
    assert per_token == pytest.approx(15e-6, rel=0.2)


def test_one_size_cannot_be_fitted():
    with pytest.raises(ValueError, match="at least two sizes"):
        fit_fixed_plus_per_unit([(100, 0.01), (100, 0.011)])
