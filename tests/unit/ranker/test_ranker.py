import math
import random

import numpy as np
import pytest

from streamrl.ranker.predictor import FeaturePredictor, setup_predictor
from streamrl.ranker.ranker import Ranker, recall_at
from streamrl.tasks import counting_prompts


def test_recall_by_hand():
    pairs = [(10, 100), (9, 1), (8, 90), (1, 80), (0, 2)]  # true top-40%: items 0 and 2
    assert recall_at(pairs, 0.4) == 0.5  # predicted top-40%: items 0 and 1
    assert recall_at(pairs, 0.2) == 1.0
    tied = [(5, 10), (4, 10), (3, 10), (2, 1), (1, 1)]  # three equally long: any of them is "top"
    assert recall_at(tied, 0.4) == 1.0
    assert recall_at([(1, 10), (5, 1), (4, 1), (3, 10), (2, 1)], 0.4) == 0.0


def _stream(n: int, seed: int):
    """Counting prompts with a known length rule: output tokens = answer chars + EOS, with noise."""
    rng = random.Random(seed)
    for p in counting_prompts(n, seed):
        true = len(p.answer) + 1
        yield str(p.index), p.text, [max(1, round(true * rng.uniform(0.8, 1.2))) for _ in range(4)]


def test_learned_ranker_recalls_the_long_tail_far_better_than_random():
    ranker = Ranker(FeaturePredictor(), window=400)
    for key, text, lengths in _stream(1500, seed=1):
        ranker.observe(f"train-{key}", text, lengths)
    # Held out: prompts it has never seen (fresh keys), predicted before learning each.
    held = list(_stream(400, seed=2))
    preds = ranker.rank([(f"held-{k}", t) for k, t, _ in held])
    pairs = [(p, sum(ls) / len(ls)) for (p, _), (_, _, ls) in zip(preds, held)]
    rng = random.Random(0)
    random_pairs = [(rng.random(), a) for _, a in pairs]
    assert recall_at(pairs, 0.2) >= 0.85
    assert recall_at(random_pairs, 0.2) <= 0.4
    # The ranker's own prequential recall (its metric) agrees.
    assert ranker.recall()[0.2] >= 0.8


def test_recurring_prompt_is_predicted_from_history_before_any_model():
    ranker = Ranker(FeaturePredictor(), min_observations=10_000)
    ranker.observe("p7", "anything", [40, 44])
    ranker.observe("p8", "anything", [3, 5])
    [(long_len, long_rank), (short_len, short_rank)] = ranker.rank([("p7", "anything"), ("p8", "anything")])
    assert long_len == pytest.approx(42, rel=0.01) and short_len == pytest.approx(4, rel=0.01)
    assert (long_rank, short_rank) == (0, 1)


def test_state_survives_a_restart(tmp_path):
    path = tmp_path / "ranker.npz"
    ranker = Ranker(FeaturePredictor(), state_path=path, save_every=10_000)
    for key, text, lengths in _stream(300, seed=3):
        ranker.observe(key, text, lengths)
    probe = [(k, t) for k, t, _ in _stream(50, seed=4)]
    before = ranker.rank(probe)
    recall = ranker.recall()
    ranker.save()
    again = Ranker(FeaturePredictor(), state_path=path)
    assert again.num_observed == 300
    assert again.rank(probe) == before
    assert again.recall() == recall


def test_bad_input_and_unknown_predictor():
    with pytest.raises(ValueError, match="no lengths"):
        Ranker(FeaturePredictor()).observe("k", "t", [])
    with pytest.raises(ValueError, match="unknown predictor"):
        setup_predictor("oracle-ish")


def test_predictor_learns_the_log_length_rule():
    p = FeaturePredictor()
    texts = [f"{a}..{a + s}:" for a, s in [(1, 2), (5, 20), (30, 3), (10, 25), (2, 9)] * 20]
    y = np.array([math.log1p(3 * (t.count(".") and int(t.split("..")[1][:-1]) - int(t.split("..")[0]))) for t in texts])
    p.update(texts, y)
    got = p.predict(["3..28:", "3..4:"])
    assert got[0] > got[1] + 1.0
