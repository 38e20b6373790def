"""What `streamrl profile` measures of a generator's engine: PTL(BS) through the engine's own
measure_latency (what every replica runs as it starts) at its own context and a long one,
prefill seconds per prompt token through its public request path, and swapping a published
weight version in, all on a thread of their own as a replica steps its engine. Knows the
engine interface, not the profile file."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from streamrl.generator.engine import Engine, GenerationRequest, ptl_batch_sizes
from streamrl.weights import WeightStore, deserialize


@dataclass(frozen=True)
class GenerationMeasurement:
    ptl: list[tuple[int, float]]
    """(batch size, seconds per decode step), ascending."""
    ptl_context: int
    """Tokens of context per sequence while PTL was measured."""
    long_context: int
    """The context PTL was measured again at (0: not)."""
    context_s_per_token: float
    """Seconds a decode step grows per running sequence per token of context beyond ptl_context."""
    prefill_s_per_token: float
    """Seconds of a step that admits prompts (prefill and the first token), per prompt token."""
    max_batch_size: int
    """The engine's capacity."""
    weight_load_s: float
    """Seconds to take a published version in: decode its bytes and load them into the engine."""


def measure_weight_load(engine: Engine, rounds: int = 3) -> float:
    """A version of the engine's own weights published as the trainer publishes them, then
    decoded and loaded as a replica does once its bytes are here (median of `rounds`)."""
    params = dict(engine.model.named_parameters())
    weights = {name: p.detach().clone() for name, p in params.items()}
    store = WeightStore(keep=1, chunk_bytes=1 << 20)
    version = engine.policy_version
    seconds = []
    for k in range(rounds):
        published = store.publish(version + 1 + k, weights)
        t0 = time.perf_counter()
        engine.load_weights(deserialize(published.blob).items(), published.policy_version)
        seconds.append(time.perf_counter() - t0)
    engine.load_weights(weights.items(), version)  # back to what it held
    return statistics.median(seconds)


def context_slope(short: list[tuple[int, float]], long: list[tuple[int, float]], extra_tokens: int) -> float:
    """Seconds per running sequence per context token, fitted through the origin to how much
    longer each batch size's step took `extra_tokens` further into its sequences (>= 0)."""
    grew = dict(long)
    num = sum((grew[b] - s) * b * extra_tokens for b, s in short)
    den = sum((b * extra_tokens) ** 2 for b, _ in short)
    return max(0.0, num / den) if den else 0.0


def _median_ptl(engine: Engine, sizes: list[int], steps: int, rounds: int, context: int | None = None):
    measured = [dict(engine.measure_latency(sizes, steps, context)) for _ in range(rounds)]
    return [(b, statistics.median(m[b] for m in measured)) for b in sizes]


def measure_generation(engine: Engine, batch_sizes: list[int] | None = None, steps: int = 4, prompt_tokens: int = 32,
                       prefill_batch: int = 4, prefill_rounds: int = 2, rounds: int = 3,
                       long_context: int | None = None) -> GenerationMeasurement:
    """PTL(BS) at `batch_sizes` (default: those a replica measures at start-up), the median of
    `rounds` measurements, and again at `long_context` tokens for the step's growth with
    context; prefill of `prefill_batch` prompts of `prompt_tokens` tokens (mean of
    `prefill_rounds` after a warm-up); and loading a weight version. On a thread of its own, as a
    replica runs its engine (the worker's engine thread; its start-up measurement in a worker
    thread): with more than one torch thread a decode step there costs up to twice what it
    costs on the main thread (the tiny model), which would flatter a colocated process."""
    with ThreadPoolExecutor(1, thread_name_prefix="engine") as thread:
        return thread.submit(_measure, engine, batch_sizes, steps, prompt_tokens, prefill_batch, prefill_rounds,
                             rounds, long_context).result()


def _measure(engine: Engine, batch_sizes: list[int] | None, steps: int, prompt_tokens: int, prefill_batch: int,
             prefill_rounds: int, rounds: int, long_context: int | None) -> GenerationMeasurement:
    capacity = engine.stats().capacity
    sizes = sorted({min(b, capacity) for b in batch_sizes}) if batch_sizes else ptl_batch_sizes(capacity)
    ptl = _median_ptl(engine, sizes, steps, rounds)
    slope, long_context = 0.0, long_context or 0
    if long_context > engine.ptl_context:
        slope = context_slope(ptl, _median_ptl(engine, sizes, steps, rounds, long_context),
                              long_context - engine.ptl_context)
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
    return GenerationMeasurement(ptl, engine.ptl_context, long_context, slope, per_token, capacity,
                                 measure_weight_load(engine))
