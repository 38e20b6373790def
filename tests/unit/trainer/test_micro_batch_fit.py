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
    assert per_token == pytest.approx((100 * 0.001 + 200 * 0.003) / (100**2 + 200**2))


def test_one_size_cannot_be_fitted():
    with pytest.raises(ValueError, match="at least two sizes"):
        fit_fixed_plus_per_unit([(100, 0.01), (100, 0.011)])


def test_training_is_measured_over_the_shapes_the_job_trains(tiny_model_dir, monkeypatch):
    import threading

    from streamrl.models import load_model
    from streamrl.spec import AlgorithmSpec
    from streamrl.trainer import profile

    shapes, threads = [], set()
    made = profile.synthetic_groups

    def noting(num_samples, group_size, prompt_tokens, completion_tokens):
        shapes.append((num_samples, completion_tokens))
        threads.add(threading.current_thread().name)
        return made(num_samples, group_size, prompt_tokens, completion_tokens)

    monkeypatch.setattr(profile, "synthetic_groups", noting)
    algo = AlgorithmSpec(microBatchSize=8, groupSize=4, maxNewTokens=48)
    m = profile.measure_training(load_model(tiny_model_dir), algo, prompt_tokens=8, completion_tokens=12, steps=1)
    # a quarter of the completion, the completion, the longest a sample can be (maxNewTokens), full; and a
    # quarter-full micro-batch
    assert sorted(shapes) == [(2, 12), (8, 3), (8, 12), (8, 48)]
    assert threading.main_thread().name not in threads  # on a worker thread, as the trainer runs its learner
    assert m.forward_backward_s_per_token > 0 and m.forward_backward_s_per_micro_batch >= 0
