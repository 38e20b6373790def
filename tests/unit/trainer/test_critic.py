"""PPO's pieces: GAE worked out by hand, the value loss, the critic (a value head on the policy's
architecture that starts at 0 and learns the returns), and a ppo learner that raises the
log-probability of a rewarded completion while its critic's values move toward the rewards."""

import pytest
import torch

from streamrl.logprobs import pack, token_logprobs
from streamrl.models import load_model
from streamrl.samples import Group, Sample, ScoredSample
from streamrl.spec import AlgorithmSpec
from streamrl.trainer.critic import Critic, gae
from streamrl.trainer.learner import Learner, value_loss


def test_gae_by_hand():
    # Sample 0: three completion tokens (positions 1..3), reward 1 at the last; sample 1: two
    # tokens (positions 0..1), reward -1. gamma 0.9, lambda 0.5.
    values = torch.tensor([[9.0, 0.5, 0.4, 0.2], [0.1, 0.3, 7.0, 7.0]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    adv, ret = gae(values, torch.tensor([1.0, -1.0]), mask, gamma=0.9, lam=0.5)
    d3 = 1.0 - 0.2  # the last token: r + gamma * 0 - V
    d2 = 0.9 * 0.2 - 0.4
    d1 = 0.9 * 0.4 - 0.5
    a3, a2 = d3, d2 + 0.45 * d3
    a1 = d1 + 0.45 * a2
    e1 = -1.0 - 0.3
    e0 = 0.9 * 0.3 - 0.1 + 0.45 * e1
    assert adv.flatten().tolist() == pytest.approx([0.0, a1, a2, a3, e0, e1, 0.0, 0.0])
    assert ret.flatten().tolist() == pytest.approx([0.0, a1 + 0.5, a2 + 0.4, a3 + 0.2, e0 + 0.1, e1 + 0.3, 0.0, 0.0])
    # gamma = lambda = 1: every token's advantage is the reward less its own value (Monte Carlo)
    mc, _ = gae(values, torch.tensor([1.0, -1.0]), mask, gamma=1.0, lam=1.0)
    assert mc.flatten().tolist() == pytest.approx([0.0, 0.5, 0.6, 0.8, -1.1, -1.3, 0.0, 0.0])


def test_value_loss_is_half_the_squared_error_per_token_mean_or_sum():
    values, returns = torch.tensor([[1.0, 2.0], [0.0, 5.0]]), torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    assert float(value_loss(values, returns, mask)) == pytest.approx((0.5 + 2.0) / 2 + 2.0)
    assert float(value_loss(values, returns, mask, weight=0.5, token_normalizer=4.0)) == \
        pytest.approx(0.5 * (2.5 + 2.0) / 4.0)


def test_the_critic_starts_at_zero_on_the_policys_weights(tiny_model_dir):
    policy = load_model(tiny_model_dir)
    critic = Critic(policy)
    batch = pack([[1, 5, 6]], [[7, 8, 2]])
    assert critic(batch).shape == (1, 5) and torch.count_nonzero(critic(batch)) == 0
    mine, theirs = dict(critic.model.named_parameters()), dict(policy.get_decoder().named_parameters())
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert all(p.data_ptr() != theirs[k].data_ptr() for k, p in mine.items())  # a copy: it trains apart


def _group(prompt, completions, logprobs, rewards):
    samples = tuple(ScoredSample(Sample("p", i, tuple(c), tuple(lp), 0, "stop"), r, 0.0)
                    for i, (c, lp, r) in enumerate(zip(completions, logprobs, rewards)))
    return Group("p", 0, 0, tuple(prompt), samples)


def test_a_ppo_learner_raises_the_rewarded_completion_and_its_critic_learns_the_rewards(tiny_model_dir):
    torch.manual_seed(0)
    model = load_model(tiny_model_dir)
    learner = Learner(model, AlgorithmSpec(type="ppo", learning_rate=1e-2, critic_learning_rate=1e-2,
                                           micro_batch_size=2, gae_lambda=1.0))
    prompt, good, bad = [1, 5, 6], [7, 8, 2], [9, 9, 2]
    batch = pack([prompt, prompt], [good, bad])
    with torch.no_grad():
        before = token_logprobs(model, batch)
    behaviour = [tuple(before[i][batch.completion_mask[i]].tolist()) for i in range(2)]
    losses = []
    for _ in range(10):  # the same two samples, rewards 1 and 0: always on-policy enough to learn
        learner.accumulate([_group(prompt, [good, bad], behaviour, [1.0, 0.0])], num_samples_in_step=2)
        losses.append(learner.step().value_loss)
    with torch.no_grad():
        after = token_logprobs(model, batch).sum(-1)
        values = learner.critic(batch)
    assert after[0] > before[0].sum() and after[1] < before[1].sum()
    # the critic fits the returns (each loss is taken before its step's update)
    assert losses[-1] < 0.6 * losses[0]
    good_v, bad_v = values[0][batch.completion_mask[0]], values[1][batch.completion_mask[1]]
    assert good_v.mean() > bad_v.mean()  # it tells the rewarded completion from the other
