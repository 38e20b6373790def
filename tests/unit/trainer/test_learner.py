import math

import pytest
import torch

from streamrl.samples import Group, Sample, ScoredSample, group_advantages
from streamrl.spec import AlgorithmSpec
from streamrl.trainer.learner import Learner, ppo_clip_loss


def test_group_advantages_by_hand():
    # mean 0.5, Bessel std sqrt(1/3)
    adv = group_advantages([1.0, 0.0, 1.0, 0.0])
    s = math.sqrt(1 / 3)
    assert adv == pytest.approx([0.5 / s, -0.5 / s, 0.5 / s, -0.5 / s], rel=1e-5)
    assert group_advantages([1.0, 0.0, 0.0], scale=False) == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert group_advantages([0.7, 0.7, 0.7]) == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)


def test_ppo_clip_loss_by_hand():
    # Sample 0 (A=+1): ratios e^0.1 (~1.105, inside [0.8, 1.28]) and e^0.5 (~1.649, clipped to 1.28).
    # Sample 1 (A=-2): ratio e^-0.5 (~0.607 -> clipped to 0.8; min(-2*.607, -2*.8) = -1.6), one token.
    logp = torch.tensor([[0.1, 0.5], [-0.5, 0.0]])
    behaviour = torch.zeros(2, 2)
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, -2.0])
    t = ppo_clip_loss(logp, behaviour, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    s0 = -(math.exp(0.1) + 1.28) / 2
    s1 = -(-2 * 0.8)
    assert float(t.loss) == pytest.approx(s0 + s1, rel=1e-5)
    assert t.clip_fraction == pytest.approx(2 / 3)
    # token-sum normalisation divides each sample's sum by a constant instead.
    t2 = ppo_clip_loss(logp, behaviour, adv, mask, 0.2, 0.28, token_normalizer=4.0, weight=0.5)
    assert float(t2.loss) == pytest.approx(0.5 * (-(math.exp(0.1) + 1.28) + 1.6) / 4.0, rel=1e-5)


def test_ppo_clip_gradient_vanishes_only_on_the_clipped_side():
    logp = torch.tensor([[0.5, 0.5]], requires_grad=True)
    t = ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), 0.2, 0.28)
    t.loss.backward()
    assert logp.grad.abs().sum() == 0  # ratio 1.65 > 1.28 with A > 0: no push further
    logp2 = torch.tensor([[0.5]], requires_grad=True)
    ppo_clip_loss(logp2, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), 0.2, 0.28).loss.backward()
    assert logp2.grad.item() == pytest.approx(math.exp(0.5))  # A < 0: still pulled down


def test_kl_term_is_k3_and_zero_at_the_reference():
    logp = torch.tensor([[-1.0, -2.0]])
    same = ppo_clip_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), 0.2, 0.28, logp.clone(), 0.5)
    assert same.kl == pytest.approx(0.0) and float(same.loss) == pytest.approx(0.0)
    ref = torch.tensor([[-1.5, -2.0]])
    t = ppo_clip_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), 0.2, 0.28, ref, 0.5)
    k3 = math.exp(-0.5) + 0.5 - 1
    assert t.kl == pytest.approx(k3 / 2, rel=1e-5)
    assert float(t.loss) == pytest.approx(0.5 * k3 / 2, rel=1e-5)


def _group(prompt, completions, logprobs, advantages):
    samples = tuple(
        ScoredSample(Sample("p", i, tuple(c), tuple(lp), 0, "stop"), 0.0, a)
        for i, (c, lp, a) in enumerate(zip(completions, logprobs, advantages))
    )
    return Group("p", 0, 0, tuple(prompt), samples)


def test_learner_step_raises_the_logprob_of_positive_advantage_samples(tiny_model_dir):
    from streamrl.logprobs import pack, token_logprobs
    from streamrl.models import load_model

    torch.manual_seed(0)
    model = load_model(tiny_model_dir)
    learner = Learner(model, AlgorithmSpec(learning_rate=1e-2, micro_batch_size=1))
    prompt, good, bad = [1, 5, 6], [7, 8, 2], [9, 9, 2]
    batch = pack([prompt, prompt], [good, bad])
    with torch.no_grad():
        before = token_logprobs(model, batch).sum(-1)
    with torch.no_grad():
        lp = token_logprobs(model, batch)
    behaviour = [tuple(lp[i][batch.completion_mask[i]].tolist()) for i in range(2)]
    learner.accumulate([_group(prompt, [good, bad], behaviour, [1.0, -1.0])], num_samples_in_step=2)
    stats = learner.step()
    with torch.no_grad():
        after = token_logprobs(model, batch).sum(-1)
    assert learner.policy_version == 1
    assert stats.num_samples == 2 and stats.num_micro_batches == 2
    assert after[0] > before[0] and after[1] < before[1]


def test_the_mismatch_is_measured_by_hand_and_is_zero_when_engine_and_learner_agree():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    same = ppo_clip_loss(logp, logp, torch.tensor([1.0, -1.0]), mask, 0.2, 0.28).mismatch
    assert (same.tokens, same.abs_logp, same.kl, same.ratio_max, same.capped) == (3, 0.0, 0.0, 1.0, 0)
    engine = logp - torch.tensor([[0.5, -1.0], [0.0, 9.0]])  # the last token is off the mask
    m = ppo_clip_loss(logp, engine, torch.tensor([1.0, -1.0]), mask, 0.2, 0.28).mismatch
    assert m.tokens == 3 and m.abs_logp == pytest.approx(1.5)
    k3 = (math.exp(0.5) - 1 - 0.5) + (math.exp(-1.0) - 1 + 1.0)  # r - 1 - log r, r = p / q
    assert m.kl == pytest.approx(k3, rel=1e-6) and m.ratio_max == pytest.approx(math.exp(1.0), rel=1e-6)


@pytest.mark.parametrize("mode", ["token-truncate", "sequence-truncate", "sequence-mask"])
def test_the_correction_bounds_the_update_a_perturbed_engine_would_blow_up(mode):
    # The engine reports tokens as e^4 less likely than the learner finds them. With a negative
    # advantage PPO's min() keeps the unclipped ratio e^4: the gradient is 55x what it should be.
    # A correction weighs each token by at most the cap (3), or drops the sample (mask).
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    engine = logp.detach() - 4.0
    adv, mask = torch.tensor([-1.0]), torch.ones(1, 2)
    ppo_clip_loss(logp, engine, adv, mask, 0.2, 0.28).loss.backward()
    blown_up = logp.grad.abs().max().item()
    assert blown_up == pytest.approx(math.exp(4.0) / 2, rel=1e-5)  # token-mean over 2 tokens
    logp.grad = None
    terms = ppo_clip_loss(logp, engine, adv, mask, 0.2, 0.28, importance_sampling=mode, cap=3.0)
    terms.loss.backward()
    bounded = logp.grad.abs().max().item()
    assert terms.mismatch.capped == 2  # both tokens: e^4 (or e^8 for the sample) is over 3
    assert bounded == pytest.approx(0.0 if mode == "sequence-mask" else 3.0 / 2, abs=1e-6)
    # Where the two agree, every mode is plain policy gradient: weight 1, ratio 1.
    logp.grad = None
    agreed = ppo_clip_loss(logp, logp.detach(), adv, mask, 0.2, 0.28, importance_sampling=mode, cap=3.0)
    agreed.loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.5, 0.5]]))
    assert agreed.mismatch.capped == 0


def test_importance_weights_truncate_per_token_or_per_sample_and_never_overflow():
    from streamrl.trainer.learner import importance_weights

    delta = torch.tensor([[0.5, 0.5, 0.0], [800.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    w, capped = importance_weights(delta, mask, "token-truncate", 3.0)
    torch.testing.assert_close(w, torch.tensor([[math.exp(0.5), math.exp(0.5), 0.0], [3.0, math.exp(-1.0), 0.0]]))
    assert capped.tolist() == [[False, False, False], [True, False, False]]
    w, _ = importance_weights(delta, mask, "sequence-truncate", 3.0)
    torch.testing.assert_close(w, torch.tensor([[math.e, math.e, 0.0], [3.0, 3.0, 0.0]]))
    w, _ = importance_weights(delta, mask, "sequence-mask", 3.0)
    torch.testing.assert_close(w, torch.tensor([[math.e, math.e, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.isfinite(w).all()


def test_a_learner_fed_a_perturbed_engines_logprobs_reports_the_mismatch_and_caps_it(tiny_model_dir):
    """The engine's log-probabilities as a real engine's bug would skew them (every token
    reported at a temperature twice the learner's): the step's mismatch rises from 0, and
    token-truncate caps the tokens whose ratio passes the cap."""
    from streamrl.logprobs import pack, token_logprobs
    from streamrl.models import load_model

    prompt, completions = [1, 5, 6], [[7, 8, 2], [9, 9, 2]]
    batch = pack([prompt, prompt], completions)
    stats = {}
    for name, temperature, mode in (("agreed", 1.0, "none"), ("perturbed", 2.0, "none"),
                                    ("corrected", 2.0, "token-truncate")):
        torch.manual_seed(0)
        model = load_model(tiny_model_dir)
        with torch.no_grad():
            lp = token_logprobs(model, batch, temperature)
        engine = [tuple(lp[i][batch.completion_mask[i]].tolist()) for i in range(2)]
        algo = AlgorithmSpec(learning_rate=1e-2, micro_batch_size=2,
                             importance_sampling={"mode": mode, "cap": 1.05})
        learner = Learner(model, algo)
        learner.accumulate([_group(prompt, completions, engine, [1.0, -1.0])], num_samples_in_step=2)
        stats[name] = learner.step()
    assert stats["agreed"].mismatch_abs_logp == pytest.approx(0.0, abs=1e-5)
    assert stats["agreed"].mismatch_ratio_max == pytest.approx(1.0, abs=1e-4)
    assert stats["perturbed"].mismatch_abs_logp > 0.05 and stats["perturbed"].mismatch_kl > 0
    assert stats["perturbed"].mismatch_ratio_max > 1.05
    assert stats["perturbed"].importance_capped_fraction == 0.0  # no correction asked for
    assert stats["corrected"].mismatch_abs_logp == pytest.approx(stats["perturbed"].mismatch_abs_logp)
    assert 0 < stats["corrected"].importance_capped_fraction <= 1
