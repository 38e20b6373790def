"""The simulated prompts: each iteration's prompt and output lengths (drawn from their own
seeded streams, or a run's lengths.jsonl), drifting geometrically or linearly, and what a
ranker would predict. Knows lengths, not time."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamrl.simulation.scenario import FileLengths, LognormalLengths, WorkloadSection, scenario_path


@dataclass(frozen=True)
class DrawnPrompt:
    prompt_id: str
    """`<iteration>-<position>-<dataset index>`, as the trainer names prompts."""
    dataset_index: int
    prompt_tokens: int
    lengths: tuple[int, ...]
    """[group size] output tokens of each sample."""
    ranked_length: float
    """What a ranker with the scenario's log error predicts for the prompt's mean length."""

    @property
    def mean_length(self) -> float:
        """The oracle's prediction: the true mean (a previous on-policy run's lengths.jsonl)."""
        return sum(self.lengths) / len(self.lengths)


def read_lengths_file(path: Path, where: str = "workload.lengths.path") -> dict[int, list[tuple[int, list[int]]]]:
    """{iteration: [(position, lengths), ...] in position order} from a run's lengths.jsonl."""
    by_iteration: dict[int, list[tuple[int, list[int]]]] = {}
    try:
        for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            iteration, position = (int(x) for x in str(rec["prompt_id"]).split("-")[:2])
            lengths = [int(n) for n in rec["lengths"]]
            if not lengths or min(lengths) < 0:
                raise ValueError(f"line {lineno}: lengths must be a non-empty list of token counts")
            by_iteration.setdefault(iteration, []).append((position, lengths))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{where} {path}: unusable: {err}") from None
    if not by_iteration:
        raise ValueError(f"{where} {path}: no prompts in it")
    return {j: sorted(v) for j, v in sorted(by_iteration.items())}


def read_predictions_file(path: Path, where: str = "workload.rankerPredictions") -> dict[tuple[int, int], float]:
    """{(iteration, position): predicted mean length} from a run's lengths.jsonl, for the
    prompts it dispatched with a prediction."""
    out: dict[tuple[int, int], float] = {}
    try:
        for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("predicted_length") is None:
                continue
            iteration, position = (int(x) for x in str(rec["prompt_id"]).split("-")[:2])
            predicted = float(rec["predicted_length"])
            if not math.isfinite(predicted) or predicted < 0:
                raise ValueError(f"line {lineno}: predicted_length must be a length >= 0, got {predicted}")
            out[(iteration, position)] = predicted
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{where} {path}: unusable: {err}") from None
    if not out:
        raise ValueError(f"{where} {path}: no predicted_length in it (the run dispatched without predictions: "
                         "use a skewness-aware run's lengths.jsonl)")
    return out


class SimWorkload:
    def __init__(self, section: WorkloadSection, prompts_per_step: int, group_size: int, seed: int,
                 base: Path | None = None):
        self.section = section
        self.prompts_per_step = prompts_per_step
        self.group_size = group_size
        self.seed = seed
        self._file: dict[int, list[tuple[int, list[int]]]] = {}
        spec = section.lengths
        if isinstance(spec, FileLengths):
            path = scenario_path(spec.path, base)
            self._file = read_lengths_file(path)
            if spec.type == "replay":
                for j, prompts in self._file.items():
                    if len(prompts) != prompts_per_step or any(len(g) != group_size for _, g in prompts):
                        raise ValueError(f"workload.lengths.path {path}: iteration {j} has {len(prompts)} prompts "
                                         f"of {sorted({len(g) for _, g in prompts})} samples; replay needs "
                                         f"algorithm.promptsPerStep {prompts_per_step} x groupSize {group_size}")
            self._pool = [g for prompts in self._file.values() for _, g in prompts]
        self._predictions: dict[tuple[int, int], float] = {}
        if section.ranker_predictions:
            self._predictions = read_predictions_file(scenario_path(section.ranker_predictions, base))

    def growth(self, iteration: int) -> float:
        """Output lengths' scale at `iteration` (1 at iteration 0)."""
        rate = self.section.median_growth_per_iteration
        if self.section.growth == "linear":
            return max(0.0, 1 + rate * iteration)
        return (1 + rate) ** iteration

    @property
    def max_prompt_tokens(self) -> int:
        w = self.section
        return w.max_prompt_tokens or max(1, 8 * w.prompt_tokens)

    def _prompt_tokens(self, n: int, rng: np.random.Generator) -> list[int]:
        """Each prompt's tokens: promptTokens, or lognormal around it (its own stream, so the
        output lengths drawn are the same with and without a spread)."""
        w = self.section
        if w.prompt_tokens_sigma == 0:
            return [w.prompt_tokens] * n
        drawn = w.prompt_tokens * np.exp(rng.normal(0.0, w.prompt_tokens_sigma, n))
        return [int(min(self.max_prompt_tokens, max(1, round(x)))) for x in drawn]

    def _groups(self, iteration: int, rng: np.random.Generator) -> list[list[float]]:
        spec, n, g = self.section.lengths, self.prompts_per_step, self.group_size
        if isinstance(spec, LognormalLengths):
            sd_prompt = spec.sigma * math.sqrt(spec.prompt_share)
            sd_sample = spec.sigma * math.sqrt(1 - spec.prompt_share)
            medians = spec.median * np.exp(rng.normal(0.0, sd_prompt, n))
            return [list(m * np.exp(rng.normal(0.0, sd_sample, g))) for m in medians]
        if spec.type == "replay":
            keys = list(self._file)
            return [list(map(float, lengths)) for _, lengths in self._file[keys[iteration % len(keys)]]]
        out = []
        for k in rng.integers(0, len(self._pool), n):
            group = self._pool[k]
            out.append([float(x) for x in (group if len(group) == g else rng.choice(group, g))])
        return out

    def iteration(self, iteration: int) -> list[DrawnPrompt]:
        """The prompts of one iteration, in dataset order."""
        rng = np.random.default_rng([self.seed, iteration])
        ranker = np.random.default_rng([self.seed, iteration, 1])
        cap, scale = self.section.max_new_tokens, self.growth(iteration)
        groups = self._groups(iteration, rng)
        prompt_tokens = self._prompt_tokens(len(groups), np.random.default_rng([self.seed, iteration, 2]))
        out = []
        for k, group in enumerate(groups):
            lengths = tuple(int(min(cap, max(1, round(x * scale)))) for x in group)
            index = iteration * self.prompts_per_step + k
            mean = sum(lengths) / len(lengths)
            ranked = mean * math.exp(ranker.normal(0.0, self.section.ranker_log_error))  # drawn either way: one stream
            ranked = self._predictions.get((iteration, k), ranked)
            out.append(DrawnPrompt(f"{iteration}-{k}-{index}", index, prompt_tokens[k], lengths, ranked))
        return out

    def typical_context(self) -> int:
        """Prompt plus half a median output at iteration 0: the context of PTL points a replica reports."""
        drawn = self.iteration(0)
        first = sorted(n for p in drawn for n in p.lengths)
        prompts = sorted(p.prompt_tokens for p in drawn)
        return prompts[len(prompts) // 2] + first[len(first) // 2] // 2
