"""Reward functions, by name: (completion text, reference answer) -> float.

Registered: `exact-match`, `numeric` (math-verify equivalence), `prefix-match`
(partial credit); anything else is resolved as a user's `module:function`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

from streamrl.samples import Sample

RewardFn = Callable[[str, str], float]


def exact_match(completion: str, answer: str) -> float:
    return 1.0 if completion.strip() == answer.strip() else 0.0


def numeric(completion: str, answer: str) -> float:
    """1 when the completion's final answer equals the reference mathematically."""
    from math_verify import parse, verify

    gold = parse(answer)
    pred = parse(completion)
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred) else 0.0


def prefix_match(completion: str, answer: str) -> float:
    """Fraction of the answer's words reproduced in order from the start, minus a
    penalty for extra words; 1 only for an exact match."""
    got, want = completion.split(), answer.split()
    if not want:
        return 1.0 if not got else 0.0
    n = 0
    for g, w in zip(got, want):
        if g != w:
            break
        n += 1
    extra = max(0, len(got) - len(want))
    return max(0.0, (n - extra) / len(want))


REGISTRY: dict[str, RewardFn] = {
    "exact-match": exact_match,
    "numeric": numeric,
    "prefix-match": prefix_match,
}


def get_reward(name: str) -> RewardFn:
    """The reward called `name`: a registered one or `module:function`."""
    if name in REGISTRY:
        return REGISTRY[name]
    if ":" not in name:
        raise ValueError(
            f"reward.function {name!r}: not a registered reward ({', '.join(REGISTRY)}) "
            "and not of the form module:function"
        )
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"reward.function {name!r}: cannot import {module_name}: {err}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward.function {name!r}: {module_name} has no callable {attr}")
    return cast(RewardFn, fn)  # the job's own: trusted to take a completion and an answer


class RewardError(RuntimeError):
    """The job's reward function raised on a completion (the message names it and the sample)."""


def sample_scorer(name: str, decode: Callable[[tuple[int, ...]], str]) -> Callable[[Sample, str], float]:
    """(sample, answer) -> reward with the reward called `name`, the completion decoded by
    `decode`; whatever the function raises becomes a RewardError naming it and the sample."""
    fn = get_reward(name)

    def score(sample: Sample, answer: str) -> float:
        text = decode(sample.completion_token_ids)
        try:
            return float(fn(text, answer))
        except Exception as err:  # the user's code: anything it raises is reported, typed
            raise RewardError(f"reward.function {name!r} raised on prompt {sample.prompt_id} sample "
                              f"{sample.sample_index} (completion {text[:60]!r}): {type(err).__name__}: {err}") from err

    return score
