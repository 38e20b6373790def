"""The learner's cost per micro-batch as `streamrl profile` fits it: a fixed part and seconds per
padded token, from single micro-batches of several shapes; never negative."""

import pytest

from streamrl.trainer.profile import fit_micro_batch_cost


def test_the_fit_recovers_a_fixed_cost_and_a_per_token_slope():
    points = [(tokens, 0.003 + 4e-5 * tokens) for tokens in (184, 736, 3328)]
    assert fit_micro_batch_cost(points) == pytest.approx((0.003, 4e-5))


def test_a_negative_intercept_is_refitted_through_the_origin():
    per_micro_batch, per_token = fit_micro_batch_cost([(100, 0.001), (200, 0.0030)])
    assert per_micro_batch == 0.0
    assert per_token == pytest.approx((100 * 0.001 + 200 * 0.003) / (100**2 + 200**2))


def test_one_size_cannot_be_fitted():
    with pytest.raises(ValueError, match="at least two sizes"):
        fit_micro_batch_cost([(100, 0.01), (100, 0.011)])
