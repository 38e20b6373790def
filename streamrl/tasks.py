"""Prompt sources with reference answers: built-in synthetic tasks and JSONL files.

Knows text only (no tokenizer). Built-in tasks have long-tailed answer lengths on purpose:
that tail is what makes generation skewed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from streamrl.spec import TaskName, TaskSpec


@dataclass(frozen=True)
class Prompt:
    index: int
    """Position in the dataset; stable across epochs (the same prompt recurs)."""
    text: str
    """Prompt text given to the model."""
    answer: str
    """Reference answer the reward compares against."""


def _long_tail(rng: random.Random, low: int, high: int, head: float = 0.8, head_max: int = 3) -> int:
    """An integer in [low, high]: `head` of the mass on [low, head_max], the rest spread
    over (head_max, high] with weights ~ 1/k (a long tail)."""
    if rng.random() < head:
        return rng.randint(low, head_max)
    ks = list(range(head_max + 1, high + 1))
    return rng.choices(ks, weights=[1.0 / k for k in ks])[0]


def counting_prompts(num: int, seed: int) -> list[Prompt]:
    """'a..b:' -> 'a a+1 ... b' with 0 <= a and b <= 99; span b - a is long-tailed in [1, 30]."""
    rng = random.Random(seed)
    out = []
    for i in range(num):
        span = _long_tail(rng, 1, 30)
        a = rng.randint(0, 99 - span)
        b = a + span
        out.append(Prompt(i, f"{a}..{b}:", " ".join(str(x) for x in range(a, b + 1))))
    return out


def counting_ramp_prompts(num: int, seed: int, max_span: int = 30) -> list[Prompt]:
    """Counting with spans spread evenly over [1, max_span] (no long tail): walked as a
    curriculum, output lengths ramp up steadily over the epoch (an elastic-scaling workload)."""
    rng = random.Random(seed)
    out = []
    for i in range(num):
        span = 1 + (i * max_span) // num
        a = rng.randint(0, 99 - span)
        out.append(Prompt(i, f"{a}..{a + span}:", " ".join(str(x) for x in range(a, a + span + 1))))
    return out


def addition_prompts(num: int, seed: int) -> list[Prompt]:
    """'x+y=' -> the sum; the number of digits is long-tailed in [1, 18]."""
    rng = random.Random(seed)
    out = []
    for i in range(num):
        digits = _long_tail(rng, 1, 18, head_max=2)
        x = rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)
        y = rng.randint(0, 10**digits - 1)
        out.append(Prompt(i, f"{x}+{y}=", str(x + y)))
    return out


def jsonl_prompts(path: str | Path) -> list[Prompt]:
    """Prompts from a JSONL file of {"prompt": str, "answer": str} objects."""
    path = Path(path)
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise ValueError(f"task.path {path}: cannot read: {err.strerror}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"task.path {path}:{lineno}: not JSON: {err.msg}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or "answer" not in obj:
            raise ValueError(f'task.path {path}:{lineno}: expected {{"prompt": str, "answer": str}}')
        out.append(Prompt(len(out), obj["prompt"], str(obj["answer"])))
    if not out:
        raise ValueError(f"task.path {path}: no prompts")
    return out


def task_file(spec: TaskSpec, log=print) -> Path:
    """The `jsonl` task's file: its path, or the Hub dataset file downloaded (once) into the
    hub cache; ValueError for a claim (Kubernetes mounts it and names the path to the pods)."""
    if spec.hf is not None:
        from streamrl.hub import download_file

        return download_file(spec.hf, log)
    if spec.pvc is not None:
        raise ValueError("task.pvc: a claim is mounted by the operator into the trainer's pods, in Kubernetes "
                         "only; on this machine use task.path with the file")
    assert spec.path is not None  # the spec requires path, hf or pvc for a jsonl task
    return Path(spec.path)


def load_prompts(spec: TaskSpec) -> list[Prompt]:
    if spec.name == TaskName.counting:
        return counting_prompts(spec.num_prompts, spec.seed)
    if spec.name == TaskName.counting_ramp:
        return counting_ramp_prompts(spec.num_prompts, spec.seed)
    if spec.name == TaskName.addition:
        return addition_prompts(spec.num_prompts, spec.seed)
    return jsonl_prompts(task_file(spec))


class PromptCursor:
    """Walks the dataset in shuffled epochs (seeded), so runs are reproducible; with
    `curriculum`, each epoch goes shortest reference answer first (ties shuffled), so
    output lengths grow over the epoch."""

    def __init__(self, prompts: list[Prompt], seed: int, curriculum: bool = False):
        self._prompts = prompts
        self._rng = random.Random(seed)
        self._curriculum = curriculum
        self._order: list[int] = []
        self.epoch = -1

    def take(self, num: int) -> list[Prompt]:
        out = []
        while len(out) < num:
            if not self._order:
                self._order = list(range(len(self._prompts)))
                self._rng.shuffle(self._order)
                if self._curriculum:  # popped from the end: longest first in the list
                    self._order.sort(key=lambda i: len(self._prompts[i].answer), reverse=True)
                self.epoch += 1
            out.append(self._prompts[self._order.pop()])
        return out

    def __iter__(self) -> Iterator[Prompt]:
        while True:
            yield from self.take(1)
