"""Splitting a step's samples over the trainer's ranks by tokens."""

import random

from streamrl.trainer.ranks import balance_by_tokens


def test_a_long_tailed_step_is_split_so_token_counts_differ_by_at_most_one_sample():
    rng = random.Random(0)
    # Long-tailed output lengths: most short, a few very long (p99/p50 well above 8).
    tokens = [int(rng.lognormvariate(3.0, 1.2)) + 4 for _ in range(257)]
    items = list(range(len(tokens)))
    for ranks in (2, 3, 8):
        shares = balance_by_tokens(items, tokens, ranks)
        assert sorted(i for share in shares for i in share) == items  # each sample once
        loads = [sum(tokens[i] for i in share) for share in shares]
        assert max(loads) - min(loads) <= max(tokens), (ranks, loads)
    # Splitting by count instead would leave one rank with the long samples.
    by_count = [sum(tokens[i] for i in items[r::2]) for r in range(2)]
    balanced = [sum(tokens[i] for i in share) for share in balance_by_tokens(items, tokens, 2)]
    assert max(balanced) - min(balanced) <= max(by_count) - min(by_count)


def test_one_rank_takes_everything_and_an_empty_step_gives_empty_shares():
    assert balance_by_tokens(["a", "b"], [5, 9], 1) == [["b", "a"]]
    assert balance_by_tokens([], [], 3) == [[], [], []]
