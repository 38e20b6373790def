"""The heavier predictor: a small causal LM fine-tuned online to rank prompts by length."""

import random

import numpy as np
import pytest

from streamrl.models import build_tiny_model
from streamrl.ranker.predictor import CausalLMPredictor, setup_predictor
from streamrl.ranker.ranker import Ranker, recall_at
from streamrl.spec import RankerSpec


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("lm"), seed=0)


def _stream(n: int, seed: int):
    """12-letter prompts; the output length grows with the number of 'z's (a rule a
    character-level LM can pick up), with noise."""
    rng = random.Random(seed)
    for i in range(n):
        zs = min(12, int(rng.expovariate(0.6)))
        letters = ["z"] * zs + [rng.choice("abcdefgh") for _ in range(12 - zs)]
        rng.shuffle(letters)
        true = 4 + 12 * zs
        yield f"{seed}-{i}", "".join(letters), [max(1, round(true * rng.uniform(0.8, 1.2))) for _ in range(4)]


def test_causal_lm_ranker_recalls_the_long_tail_far_better_than_random(model_dir):
    ranker = Ranker(CausalLMPredictor(str(model_dir), lr=3e-3), window=200, min_observations=32)
    for key, text, lengths in _stream(800, seed=1):
        ranker.observe(key, text, lengths)
    held = list(_stream(300, seed=2))
    preds = ranker.rank([(k, t) for k, t, _ in held])  # never-seen keys: the model alone
    pairs = [(p, sum(ls) / len(ls)) for (p, _), (_, _, ls) in zip(preds, held)]
    rng = random.Random(0)
    assert recall_at(pairs, 0.2) >= 0.75
    assert recall_at([(rng.random(), a) for _, a in pairs], 0.2) <= 0.4


def test_causal_lm_state_survives_a_restart(model_dir, tmp_path):
    path = tmp_path / "ranker.npz"
    ranker = Ranker(CausalLMPredictor(str(model_dir)), state_path=path, min_observations=8)
    for key, text, lengths in _stream(64, seed=3):
        ranker.observe(key, text, lengths)
    probe = [(k, t) for k, t, _ in _stream(20, seed=4)]
    before = ranker.rank(probe)
    ranker.save()
    again = Ranker(CausalLMPredictor(str(model_dir)), state_path=path, min_observations=8)
    assert again.predictor.num_observed == 64
    assert np.allclose([p for p, _ in again.rank(probe)], [p for p, _ in before], rtol=1e-5)
    # Another predictor's state is refused with a message, not loaded half-way.
    with pytest.raises(ValueError, match="another predictor"):
        Ranker(CausalLMPredictor(str(model_dir)), state_path=path).predictor.load_state({"num_observed": 1})


def test_causal_lm_needs_a_model():
    with pytest.raises(ValueError, match="modelPath is required"):
        RankerSpec.model_validate({"predictor": "causal-lm"})
    with pytest.raises(ValueError, match="needs ranker.modelPath"):
        setup_predictor("causal-lm")
