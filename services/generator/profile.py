"""What `streamrl profile` measures of a generator's engine: PTL(BS) through the engine's own
measure_latency (what every replica runs as it starts) at its own context and a long one,
what admitting prompts beside a running batch adds to a step through its public request path
(a cost per step and per prompt token), and swapping a published weight version in, all on
the compute thread where a replica steps its engine. Knows the engine interface, not the
profile file."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamrl import compute
from streamrl.generator.engine import Engine, GenerationRequest
from streamrl.latency import fit_fixed_plus_per_unit, ptl_batch_sizes
from streamrl.weights import WeightStore, deserialize

if TYPE_CHECKING:
    import torch


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
    """Seconds a step that admits prompts (prefill and the first token) costs beyond its decode
    step, per prompt token, admitting beside a running batch..."""
    prefill_s_per_step: float
    """...plus this much once per admitting step, whatever it admits (fitted over several sizes)."""
    max_batch_size: int
    """The engine's capacity."""
    weight_load_s: float
    """Seconds to take a published version in: decode its bytes and load them into the engine."""
    cache_release_s: float = 0.0
    """Colocated: seconds for the idle engine to let go of its KV cache (Engine.sleep)."""
    cache_allocate_s: float = 0.0
    """Colocated: seconds to allocate it again (Engine.wake_up)."""


def measure_weight_load(engine: Engine, weights: dict[str, torch.Tensor] | None = None, rounds: int = 3) -> float:
    """A version of the policy's weights (`weights`, named as the policy's named_parameters, as
    the trainer publishes them; default: the torch engine's own) published as the trainer
    publishes them, then decoded and loaded as a replica does once its bytes are here (median of
    `rounds`). The engine is left holding `weights` at its version."""
    if weights is None:
        from streamrl.generator.torch_engine import TorchEngine

        assert isinstance(engine, TorchEngine)  # the default is the torch engine's own
        weights = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
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
                       prefill_batches: tuple[int, ...] = (1, 4, 16, 64), prefill_rounds: int = 5, rounds: int = 3,
                       long_context: int | None = None, weights: dict[str, torch.Tensor] | None = None,
                       thread: Executor | None = None) -> GenerationMeasurement:
    """PTL(BS) at `batch_sizes` (default: those a replica measures at start-up), the median of
    `rounds` measurements, and again at `long_context` tokens for the step's growth with
    context; steps admitting each of `prefill_batches` prompts (up to the engine's capacity)
    of `prompt_tokens` tokens beside a running batch that fills it (what each costs beyond its
    decode step, median of `prefill_rounds` after a warm-up), fitted as a cost
    per step plus one per prompt token (a step admitting 64 prompts costs far less than 16
    admitting 4: its fixed part is paid once); and loading a weight version of `weights` (the
    policy's named parameters; an engine that holds no torch model, vLLM's, needs them given).

    On the process's compute thread (streamrl.compute), where a replica and a colocated trainer
    step their engine: `thread`, when the caller holds it (`streamrl profile` measures the
    learner there too), else one of its own."""
    return compute.run(_measure, engine, batch_sizes, steps, prompt_tokens, prefill_batches, prefill_rounds, rounds,
                       long_context, weights, thread=thread, name="engine")


def measure_cache_switch(engine: Engine, rounds: int = 5) -> tuple[float, float]:
    """Colocated mode's engine side of its two switches, the idle engine's sleep (its KV cache
    released) and wake_up (allocated again), seconds each (medians of `rounds`)."""
    released, allocated = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        if not engine.sleep():
            raise RuntimeError("measure_cache_switch needs an idle engine")
        t1 = time.perf_counter()
        engine.wake_up()
        released.append(t1 - t0)
        allocated.append(time.perf_counter() - t1)
    return statistics.median(released), statistics.median(allocated)


def _measure(engine: Engine, batch_sizes: list[int] | None, steps: int, prompt_tokens: int,
             prefill_batches: tuple[int, ...], prefill_rounds: int, rounds: int,
             long_context: int | None, weights: dict[str, torch.Tensor] | None) -> GenerationMeasurement:
    capacity = engine.stats().capacity
    sizes = sorted({min(b, capacity) for b in batch_sizes}) if batch_sizes else ptl_batch_sizes(capacity)
    ptl = _median_ptl(engine, sizes, steps, rounds)
    slope, long_context = 0.0, long_context or 0
    if long_context > engine.ptl_context:
        slope = context_slope(ptl, _median_ptl(engine, sizes, steps, rounds, long_context),
                              long_context - engine.ptl_context)
    points = [(n * prompt_tokens, _admission_s(engine, n, prompt_tokens, prefill_rounds))
              for n in sorted({min(b, capacity) for b in prefill_batches})]
    per_step, per_token = fit_fixed_plus_per_unit(points) if len(points) > 1 else (0.0, points[0][1] / points[0][0])
    return GenerationMeasurement(ptl, engine.ptl_context, long_context, slope, per_token, per_step, capacity,
                                 measure_weight_load(engine, weights), *measure_cache_switch(engine))


def _admission_s(engine: Engine, prompts: int, prompt_tokens: int, rounds: int) -> float:
    """Median seconds an engine step admitting `prompts` prompts costs beyond a decode step of
    the same batch, measured as continuous batching admits them: beside capacity - `prompts`
    sequences already decoding at the engine's PTL context, sampled at temperature 1 as serving
    samples; the admitting step and the next one (the same batch decoding, no admission) timed
    back to back. Admitting beside a running batch costs more than into an idle engine (the tiny
    model, 8 prompts beside 56: 2.0 against 1.7 ms): its caches hold the batch's keys and values.
    After a warm-up round; the running sequences are aborted after."""
    capacity = engine.stats().capacity
    context = max(1, engine.ptl_context)
    running = [f"admission-base-{prompts}-{i}" for i in range(capacity - prompts)]
    for i, rid in enumerate(running):  # long enough to outlast every round
        engine.add_request(GenerationRequest(rid, tuple(4 + (i + k) % 16 for k in range(context)),
                                             2 * rounds + 8, seed=i))
    if running:
        engine.step()  # admits them, untimed
    seconds = []
    try:
        for round_ in range(rounds + 1):
            admitted = [f"admission-{prompts}-{round_}-{i}" for i in range(prompts)]
            for i, rid in enumerate(admitted):  # more tokens than the two steps make: none finishes in them
                prompt = tuple(4 + (i + k) % 16 for k in range(prompt_tokens))  # ordinary ids of any vocabulary
                engine.add_request(GenerationRequest(rid, prompt, 8, seed=i))
            t0 = time.perf_counter()
            engine.step()
            t1 = time.perf_counter()
            engine.step()
            if round_:  # the first round warms up
                seconds.append((t1 - t0) - (time.perf_counter() - t1))
            # Gone before the next round admits (untimed): an engine whose admitting step makes one
            # token (vLLM's) would still hold them there, its batch full, and admit nothing.
            engine.abort(admitted)
    finally:
        engine.abort(running)
        while engine.has_unfinished():
            engine.step()
    return max(0.0, statistics.median(seconds))
