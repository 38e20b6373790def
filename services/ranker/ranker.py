"""The ranker: per-prompt length history blended with a learned predictor, its own recall
measured prequentially (each observation is predicted before it is learnt), and state
that survives a restart. Knows no gRPC."""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from streamrl.ranker.predictor import Predictor

log = logging.getLogger(__name__)

RECALL_FRACTIONS = (0.20, 0.10, 0.05)


def recall_at(pairs: list[tuple[float, float]], fraction: float) -> float:
    """|predicted top-x% ∩ true top-x%| / |true top-x%| over (predicted, actual) pairs.

    Ties in the actual lengths are resolved in the predictor's favour: an item counts as
    truly top-x% when it is at least as long as the k-th longest (otherwise which of
    several equally long outputs is "in" would be arbitrary)."""
    if len(pairs) < 2:
        return float("nan")
    k = max(1, round(fraction * len(pairs)))
    by_pred = sorted(range(len(pairs)), key=lambda i: -pairs[i][0])[:k]
    threshold = sorted((a for _, a in pairs), reverse=True)[k - 1]
    return sum(1 for i in by_pred if pairs[i][1] >= threshold) / k


class Ranker:
    def __init__(self, predictor: Predictor, state_path: Path | None = None, window: int = 512,
                 min_observations: int = 32, history_decay: float = 0.5, save_every: int = 256):
        self.predictor = predictor
        self.state_path = Path(state_path) if state_path else None
        self.min_observations = min_observations
        self.history_decay = history_decay
        self.save_every = save_every
        self._history: dict[str, tuple[float, int]] = {}  # key -> (EMA of log length, observations)
        self._window: deque[tuple[float, float]] = deque(maxlen=window)  # (predicted, actual) lengths
        self._sum_log = 0.0
        self.num_observed = 0
        self._unsaved = 0
        if self.state_path and self.state_path.exists():
            self.load()

    # ---- predictions ----------------------------------------------------------------
    def _predict_log(self, keys: list[str], texts: list[str]) -> np.ndarray:
        if self.predictor_ready:
            model = self.predictor.predict(texts)
        else:  # no model yet: the mean of what was seen, else nothing to tell apart
            model = np.full(len(texts), self._sum_log / self.num_observed if self.num_observed else 0.0)
        out = model.copy()
        ready = self.predictor_ready
        for i, key in enumerate(keys):
            if key in self._history:
                value, count = self._history[key]
                w = count / (count + 1.0) if ready else 1.0  # more history, more trust in it
                out[i] = w * value + (1 - w) * model[i]
        return out

    @property
    def predictor_ready(self) -> bool:
        return self.num_observed >= self.min_observations

    def rank(self, prompts: list[tuple[str, str]]) -> list[tuple[float, int]]:
        """(predicted length in tokens, rank with 0 = longest) per (key, text)."""
        if not prompts:
            return []
        logs = self._predict_log([k for k, _ in prompts], [t for _, t in prompts])
        order = sorted(range(len(prompts)), key=lambda i: (-logs[i], i))
        ranks = [0] * len(prompts)
        for r, i in enumerate(order):
            ranks[i] = r
        return [(float(np.expm1(logs[i])), ranks[i]) for i in range(len(prompts))]

    # ---- learning -------------------------------------------------------------------
    def observe(self, key: str, text: str, lengths: list[int]) -> float:
        """Learn from a prompt's output lengths; returns what was predicted for it just before."""
        if not lengths:
            raise ValueError(f"observation of {key!r} has no lengths")
        mean = sum(lengths) / len(lengths)
        target = math.log1p(mean)
        predicted = float(np.expm1(self._predict_log([key], [text])[0]))
        if self.predictor_ready or key in self._history:
            # Recall measures predictions; before any model or history every prompt gets
            # the same guess, and those ties would only add noise to it.
            self._window.append((predicted, mean))
        value, count = self._history.get(key, (target, 0))
        self._history[key] = (target if count == 0 else (1 - self.history_decay) * value + self.history_decay * target,
                              count + 1)
        self.predictor.update([text], np.array([target]))
        self._sum_log += target
        self.num_observed += 1
        self._unsaved += 1
        if self.state_path and self._unsaved >= self.save_every:
            self.save()
        return predicted

    def recall(self) -> dict[float, float]:
        """Recall of the true top-20/10/5% longest over the recent window of observations."""
        pairs = list(self._window)
        return {f: recall_at(pairs, f) for f in RECALL_FRACTIONS}

    # ---- persistence ----------------------------------------------------------------
    def save(self) -> None:
        if not self.state_path:
            return
        keys = list(self._history)
        arrays: dict[str, Any] = {f"predictor.{k}": np.asarray(v) for k, v in self.predictor.state().items()}
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, history_keys=np.array(keys, dtype=str),
                     history_values=np.array([self._history[k][0] for k in keys]),
                     history_counts=np.array([self._history[k][1] for k in keys]),
                     window=np.array(list(self._window)).reshape(-1, 2),
                     totals=np.array([self._sum_log, self.num_observed]), **arrays)
        os.replace(tmp, self.state_path)
        self._unsaved = 0

    def load(self) -> None:
        assert self.state_path is not None  # loaded only from a state file
        with np.load(self.state_path, allow_pickle=False) as z:
            self._history = {str(k): (float(v), int(c)) for k, v, c in
                             zip(z["history_keys"], z["history_values"], z["history_counts"])}
            self._window.extend((float(p), float(a)) for p, a in z["window"])
            self._sum_log, n = z["totals"]
            self.num_observed = int(n)
            self.predictor.load_state({k.removeprefix("predictor."): z[k] for k in z.files
                                       if k.startswith("predictor.")})
        log.info("ranker state loaded from %s (%d observations, %d prompts)", self.state_path, self.num_observed,
                 len(self._history))
