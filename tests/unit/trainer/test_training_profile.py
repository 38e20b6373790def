"""How `streamrl profile` times the learner: micro-batches of the shapes a run trains, partial
ones included, trained in turn so that the machine's speed drifting over the profile moves every
shape alike and the fitted fixed part per micro-batch does not drift with it."""

import pytest
import torch

import streamrl.trainer.profile as trainer_profile
from streamrl.records import StepStats
from streamrl.spec import AlgorithmSpec
from streamrl.trainer.profile import measure_training, training_shapes

FIXED_S, PER_TOKEN_S = 0.004, 5e-5


def test_the_shapes_include_the_partial_micro_batches_a_stream_trains():
    shapes = training_shapes(32, 15, 96)
    assert shapes == sorted(set(shapes))
    assert {(32, 3), (32, 15), (32, 96)} <= set(shapes)  # full: a quarter, all, the longest
    assert {(16, 15), (16, 30), (8, 15), (8, 3)} <= set(shapes)  # partial
    assert training_shapes(32, 80, 96)[-3:] == [(32, 20), (32, 80), (32, 96)]  # twice 80 is capped at 96
    assert all(n >= 1 and c >= 1 for n, c in training_shapes(1, 1, 1))


def test_shapes_are_trained_in_turn_and_a_drift_between_rounds_moves_the_fit_alike(monkeypatch):
    algo = AlgorithmSpec(micro_batch_size=8, group_size=4, max_new_tokens=32)
    shapes = training_shapes(8, 12, 32)
    trained: list[tuple[int, int]] = []

    class _FakeLearner:
        """One step costs FIXED_S + PER_TOKEN_S per padded token, times the machine's speed,
        which halves after every round of all shapes (what trained one after another the
        fit would read as a large fixed part)."""

        policy_version = 0

        def __init__(self, *args, **kwargs):
            self.shape = (0, 0)

        def accumulate(self, groups, num_samples_in_step):
            g = groups[0]
            self.shape = (num_samples_in_step, len(g.samples[0].sample.completion_token_ids))
            trained.append(self.shape)
            self.tokens = num_samples_in_step * (len(g.prompt_token_ids) + self.shape[1])

        def step(self) -> StepStats:
            slow = 2.0 ** ((len(trained) - 1) // len(shapes))
            return StepStats(self.shape[0], 1, 0.0, 0.0, 0.0, 0.0, slow * (FIXED_S + PER_TOKEN_S * self.tokens), 0.001)

        def weights(self):
            return {"w": torch.zeros(1)}

    monkeypatch.setattr(trainer_profile, "Learner", _FakeLearner)
    m = measure_training(torch.nn.Linear(1, 1), algo, prompt_tokens=6, completion_tokens=12, steps=3)
    assert trained == shapes * 4  # a warm-up round, then three rounds of every shape in turn
    # every shape's median is its second timed round: the fit reads the line at that round's speed (x4)
    assert m.forward_backward_s_per_micro_batch == pytest.approx(4 * FIXED_S)
    assert m.forward_backward_s_per_token == pytest.approx(4 * PER_TOKEN_S)
    assert m.micro_batch_size == 8 and m.sequence_tokens == 18
