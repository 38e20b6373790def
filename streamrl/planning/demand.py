"""The demand a plan is sized for: the workload's output-length distribution for one
iteration's samples (from a run's `lengths.jsonl`, or lognormal parameters) capped at the
maximum length, and the prompt length. Knows lengths, not seconds."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

NUM_QUANTILES = 4096
"""How finely a parametric distribution is represented (its quantiles at (i + 0.5) / n)."""


@dataclass(frozen=True)
class LengthDistribution:
    output_lengths: tuple[int, ...]
    """Output lengths, tokens, ascending: an empirical distribution (each equally likely)."""
    prompt_tokens: int
    """Mean prompt length, tokens."""
    source: str = ""
    """Where the lengths come from (for tables and errors)."""

    def __post_init__(self):
        if not self.output_lengths:
            raise ValueError(f"workload {self.source!r}: no output lengths")
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt tokens {self.prompt_tokens}: must be at least 1")
        object.__setattr__(self, "output_lengths", tuple(sorted(self.output_lengths)))

    @property
    def mean_output(self) -> float:
        return sum(self.output_lengths) / len(self.output_lengths)

    @property
    def max_output(self) -> int:
        return self.output_lengths[-1]

    def quantile(self, q: float) -> int:
        """The q-quantile (nearest rank) of output lengths."""
        n = len(self.output_lengths)
        return self.output_lengths[min(n - 1, max(0, math.ceil(q * n) - 1))]

    def expected_longest(self, num_samples: int) -> int:
        """The longest output expected among `num_samples` draws: the n/(n+1) quantile."""
        return self.quantile(num_samples / (num_samples + 1))

    @property
    def mean_decode_context(self) -> float:
        """Mean context of a sequence in a decode step: prompt plus half its output, weighted by
        output length (a long sample is in more steps): P + E[L^2] / (2 E[L])."""
        total = sum(self.output_lengths)
        return self.prompt_tokens + sum(x * x for x in self.output_lengths) / (2 * total)

    def describe(self) -> str:
        return (f"{self.source}: output mean {self.mean_output:.0f}, p50 {self.quantile(0.5)}, p90 "
                f"{self.quantile(0.9)}, max {self.max_output} tokens; prompts {self.prompt_tokens} tokens")

    @classmethod
    def from_lengths_file(cls, path: str | Path, prompt_tokens: int,
                          max_length: int | None = None) -> LengthDistribution:
        """Every sample's output length in a run's lengths.jsonl (`{"lengths": [...]}` per prompt)."""
        path = Path(path)
        try:
            lines = path.read_text().splitlines()
        except OSError as err:
            raise ValueError(f"--lengths {path}: cannot read: {err.strerror}") from None
        lengths: list[int] = []
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                lengths += [int(x) for x in json.loads(line)["lengths"]]
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"--lengths {path}:{lineno}: not a lengths.jsonl line "
                                 '(`{"lengths": [int, ...]}`)') from None
        if not lengths:
            raise ValueError(f"--lengths {path}: no lengths in it")
        cap = max_length or max(lengths)
        return cls(tuple(min(cap, max(1, x)) for x in lengths), prompt_tokens, str(path))

    @classmethod
    def lognormal(cls, mu: float, sigma: float, max_length: int, prompt_tokens: int) -> LengthDistribution:
        """ln(length) ~ Normal(mu, sigma), capped at max_length (sigma 0: every output exp(mu) tokens)."""
        if sigma < 0:
            raise ValueError(f"--lognormal sigma {sigma}: must be >= 0")
        if max_length < 1:
            raise ValueError(f"--max-length {max_length}: must be at least 1")
        normal = NormalDist()
        lengths = tuple(
            min(max_length, max(1, round(math.exp(mu + sigma * normal.inv_cdf((i + 0.5) / NUM_QUANTILES)))))
            for i in range(NUM_QUANTILES))
        return cls(lengths, prompt_tokens, f"lognormal(mu={mu:g}, sigma={sigma:g}, max={max_length})")
