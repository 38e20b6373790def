"""Output-length predictors: an ABC, the light learned default, and the factory.

A predictor maps prompt text to a predicted log output length and learns online from
observed lengths. It knows text and numbers only; history per prompt, recall and
persistence live in the ranker.
"""

from __future__ import annotations

import math
import re
import zlib
from abc import ABC, abstractmethod

import numpy as np

_NUMBER = re.compile(r"\d+")


class Predictor(ABC):
    @abstractmethod
    def predict(self, texts: list[str]) -> np.ndarray:
        """[N] predicted log(1 + output length)."""

    @abstractmethod
    def update(self, texts: list[str], log_lengths: np.ndarray) -> None:
        """Learn from observed [N] log(1 + mean output length)."""

    @abstractmethod
    def state(self) -> dict:
        """Everything needed to restore the predictor (numpy arrays and numbers)."""

    @abstractmethod
    def load_state(self, state: dict) -> None: ...


class FeaturePredictor(Predictor):
    """Ridge regression on hashed character n-grams plus numeric features of the prompt,
    solved in closed form and refreshed online with exponential forgetting (the policy's
    lengths drift during RL). Trains in milliseconds on CPU."""

    def __init__(self, num_buckets: int = 256, ngram: int = 3, l2: float = 1.0, forget: float = 0.999,
                 refit_every: int = 32):
        self.num_buckets = num_buckets
        self.ngram = ngram
        self.l2 = l2
        self.forget = forget
        self.refit_every = refit_every
        d = self.dim
        self._xtx = np.zeros((d, d))
        self._xty = np.zeros(d)
        self._weights = np.zeros(d)
        self._since_fit = 0
        self.num_observed = 0

    @property
    def dim(self) -> int:
        return self.num_buckets + 8

    def features(self, text: str) -> np.ndarray:
        x = np.zeros(self.dim)
        grams = [text[i : i + n] for n in range(1, self.ngram + 1) for i in range(len(text) - n + 1)]
        for g in grams:
            x[zlib.crc32(g.encode()) % self.num_buckets] += 1.0
        if grams:
            x[: self.num_buckets] /= math.sqrt(len(grams))
        nums = [int(m) for m in _NUMBER.findall(text)[:16]]
        tail = x[self.num_buckets :]
        tail[0] = 1.0  # bias
        tail[1] = math.log1p(len(text))
        tail[2] = len(nums)
        if nums:
            tail[3] = math.log1p(max(nums))
            tail[4] = math.log1p(sum(nums))
            tail[5] = math.log1p(abs(nums[-1] - nums[0]))
            tail[6] = max(len(str(n)) for n in nums)
            tail[7] = math.log1p(sum(len(str(n)) for n in nums))
        return x

    def _matrix(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.features(t) for t in texts]) if texts else np.zeros((0, self.dim))

    def predict(self, texts: list[str]) -> np.ndarray:
        return self._matrix(texts) @ self._weights

    def update(self, texts: list[str], log_lengths: np.ndarray) -> None:
        x = self._matrix(texts)
        decay = self.forget ** len(texts)
        self._xtx = decay * self._xtx + x.T @ x
        self._xty = decay * self._xty + x.T @ log_lengths
        self.num_observed += len(texts)
        self._since_fit += len(texts)
        if self._since_fit >= self.refit_every or self.num_observed <= self.refit_every:
            self._refit()

    def _refit(self) -> None:
        self._weights = np.linalg.solve(self._xtx + self.l2 * np.eye(self.dim), self._xty)
        self._since_fit = 0

    def state(self) -> dict:
        return {"xtx": self._xtx, "xty": self._xty, "weights": self._weights,
                "num_observed": self.num_observed, "num_buckets": self.num_buckets, "ngram": self.ngram}

    def load_state(self, state: dict) -> None:
        if int(state["num_buckets"]) != self.num_buckets or int(state["ngram"]) != self.ngram:
            raise ValueError("saved ranker state was made with other feature settings")
        self._xtx, self._xty, self._weights = state["xtx"], state["xty"], state["weights"]
        self.num_observed = int(state["num_observed"])


def setup_predictor(kind: str) -> Predictor:
    """The predictor a ranker spec names."""
    if kind == "features":
        return FeaturePredictor()
    raise ValueError(f"ranker.predictor {kind!r}: unknown predictor (available: features)")
