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
