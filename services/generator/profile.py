"""What `streamrl profile` measures of a generator's engine: PTL(BS) through the engine's own
measure_latency (what every replica runs as it starts) and prefill seconds per prompt token
through its public request path. Knows the engine interface, not the profile file."""

from __future__ import annotations

import time
from dataclasses import dataclass

from streamrl.generator.engine import Engine, GenerationRequest, ptl_batch_sizes


@dataclass(frozen=True)
class GenerationMeasurement:
    ptl: list[tuple[int, float]]
    """(batch size, seconds per decode step), ascending."""
    ptl_context: int
    """Tokens of context per sequence while PTL was measured."""
    prefill_s_per_token: float
    """Seconds of a step that admits prompts (prefill and the first token), per prompt token."""
    max_batch_size: int
    """The engine's capacity."""


def measure_generation(engine: Engine, batch_sizes: list[int] | None = None, steps: int = 4, prompt_tokens: int = 32,
                       prefill_batch: int = 4, prefill_rounds: int = 2) -> GenerationMeasurement:
    """PTL(BS) at `batch_sizes` (default: those a replica measures at start-up) and prefill of
    `prefill_batch` prompts of `prompt_tokens` tokens (mean of `prefill_rounds` after a warm-up)."""
    capacity = engine.stats().capacity
    sizes = sorted({min(b, capacity) for b in batch_sizes}) if batch_sizes else ptl_batch_sizes(capacity)
    ptl = engine.measure_latency(sizes, steps)
    batch = min(prefill_batch, capacity)
    seconds = []
    for round_ in range(prefill_rounds + 1):
        for i in range(batch):
            prompt = tuple(4 + (i + k) % 16 for k in range(prompt_tokens))  # ordinary ids of any vocabulary
            engine.add_request(GenerationRequest(f"prefill-{round_}-{i}", prompt, max_new_tokens=1, temperature=0.0))
        t0 = time.perf_counter()
        while engine.has_unfinished():  # one step admits, prefills and samples the one token
            engine.step()
        if round_:  # the first round warms up
            seconds.append(time.perf_counter() - t0)
    per_token = sum(seconds) / len(seconds) / (batch * prompt_tokens)
    return GenerationMeasurement(sorted(ptl), engine.ptl_context, per_token, capacity)
