"""Output-length predictors: an ABC, the light learned default, and the factory.

A predictor maps prompt text to a predicted log output length and learns online from
observed lengths. It knows text and numbers only; history per prompt, recall and
persistence live in the ranker.
"""

from __future__ import annotations

import math
import random
import re
import zlib
from abc import ABC, abstractmethod
from collections import deque

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


class CausalLMPredictor(Predictor):
    """A small causal LM fine-tuned to rank prompts by output length: a linear head on its
    mean-pooled last hidden state, trained online on a replay buffer of observations with
    a pairwise ranking loss plus a squared error on log length. The head, the final norm
    and the last `train_layers` decoder layers learn; the rest stays frozen. The heavier
    option, for a GPU (`device`); on CPU it suits small models only."""

    def __init__(self, model_path: str, device: str = "cpu", train_layers: int = 1, lr: float = 1e-3,
                 train_every: int = 16, steps: int = 4, batch_size: int = 32, buffer_size: int = 2048,
                 max_prompt_tokens: int = 256, seed: int = 0):
        import torch

        from streamrl.models import load_model, load_tokenizer

        torch.manual_seed(seed)
        self.torch = torch
        self.device = device
        self.model = load_model(model_path, device=device)
        self.tokenizer = load_tokenizer(model_path)
        self.base = self.model.base_model
        for p in self.model.parameters():
            p.requires_grad_(False)
        layers = getattr(self.base, "layers", None)
        trainable = [*(layers[-train_layers:] if layers is not None and train_layers else []),
                     *([self.base.norm] if hasattr(self.base, "norm") else [])]
        for module in trainable:
            for p in module.parameters():
                p.requires_grad_(True)
        self.head = torch.nn.Linear(self.model.config.hidden_size, 1).to(device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self._trainable = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.AdamW([*self._trainable.values(), *self.head.parameters()], lr=lr)
        self.train_every, self.steps, self.batch_size = train_every, steps, batch_size
        self.max_prompt_tokens = max_prompt_tokens
        self._buffer: deque[tuple[str, float]] = deque(maxlen=buffer_size)
        self._rng = random.Random(seed)
        self._since_train = 0
        self.num_observed = 0

    def _score(self, texts: list[str]):
        """[N] head outputs (with grad when enabled): right-padded batch, mean over real tokens."""
        torch = self.torch
        ids = [self.tokenizer.encode(t)[: self.max_prompt_tokens] or [0] for t in texts]
        width = max(len(x) for x in ids)
        tokens = torch.zeros(len(ids), width, dtype=torch.long)
        mask = torch.zeros(len(ids), width, dtype=torch.long)
        for i, x in enumerate(ids):
            tokens[i, : len(x)] = torch.tensor(x)
            mask[i, : len(x)] = 1
        tokens, mask = tokens.to(self.device), mask.to(self.device)
        hidden = self.base(input_ids=tokens, attention_mask=mask).last_hidden_state  # [N, T, H]
        m = mask[..., None].to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1)
        return self.head(pooled)[:, 0]

    def predict(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0)
        with self.torch.no_grad():
            return self._score(texts).float().cpu().numpy().astype(np.float64)

    def update(self, texts: list[str], log_lengths: np.ndarray) -> None:
        self._buffer.extend(zip(texts, (float(y) for y in log_lengths)))
        self.num_observed += len(texts)
        self._since_train += len(texts)
        if self._since_train >= self.train_every:
            self._train()

    def _train(self) -> None:
        torch = self.torch
        self.model.train()
        for _ in range(self.steps):
            batch = self._rng.sample(list(self._buffer), min(self.batch_size, len(self._buffer)))
            y = torch.tensor([b[1] for b in batch], device=self.device)
            pred = self._score([b[0] for b in batch])
            diff_pred = pred[:, None] - pred[None, :]
            sign = torch.sign(y[:, None] - y[None, :])
            pairs = sign != 0
            ranking = torch.nn.functional.softplus(-sign * diff_pred)[pairs].mean() if pairs.any() else pred.sum() * 0
            loss = ranking + torch.nn.functional.mse_loss(pred, y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        self.model.eval()
        self._since_train = 0

    def state(self) -> dict:
        out: dict = {f"param.{n}": p.detach().float().cpu().numpy() for n, p in self._trainable.items()}
        out["head.weight"] = self.head.weight.detach().float().cpu().numpy()
        out["head.bias"] = self.head.bias.detach().float().cpu().numpy()
        out["num_observed"] = self.num_observed
        return out

    def load_state(self, state: dict) -> None:
        torch = self.torch
        missing = [n for n in self._trainable if f"param.{n}" not in state]
        if missing or "head.weight" not in state:
            raise ValueError("saved ranker state was made with another predictor or model "
                             f"(missing {(missing or ['head.weight'])[:3]})")
        with torch.no_grad():
            for n, p in self._trainable.items():
                p.copy_(torch.as_tensor(state[f"param.{n}"]))
            self.head.weight.copy_(torch.as_tensor(state["head.weight"]))
            self.head.bias.copy_(torch.as_tensor(state["head.bias"]))
        self.num_observed = int(state["num_observed"])


PREDICTORS = ("features", "causal-lm")


def setup_predictor(kind: str, model_path: str | None = None, device: str = "cpu") -> Predictor:
    """The predictor a ranker spec names (`causal-lm` needs the model's directory)."""
    if kind == "features":
        return FeaturePredictor()
    if kind == "causal-lm":
        if not model_path:
            raise ValueError("ranker.predictor 'causal-lm' needs ranker.modelPath (a Hugging Face model directory)")
        return CausalLMPredictor(model_path, device=device)
    raise ValueError(f"ranker.predictor {kind!r}: unknown predictor (available: {', '.join(PREDICTORS)})")
