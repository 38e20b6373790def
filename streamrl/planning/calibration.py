"""Calibrating the roofline from a measured profile: the efficiency factors that make the
analytic model reproduce what `streamrl profile` measured on a catalog GPU, so GPU types
without a profile of their own are predicted with this software stack's measured efficiency.
Knows the two models' formulas; fits one factor per measurement, the rest stay assumed."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from streamrl.planning.catalog import Catalog, GpuType, Measurement
from streamrl.planning.costs import TrainerMemory
from streamrl.planning.profile_record import Profile
from streamrl.planning.roofline import AnalyticGenerationCost, Assumptions, analytic_training_cost
from streamrl.planning.training_fit import PublishedTrainingRun

_FACTORS = ("decode_bandwidth_efficiency", "decode_compute_efficiency", "prefill_compute_efficiency",
            "train_matmul_efficiency")


def load_assumptions(path: str | Path) -> Assumptions:
    """Assumptions from a YAML mapping of their fields (the rest keep their defaults)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return Assumptions.model_validate(data)
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"--assumptions {path}: cannot read: {err}") from None
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ValueError(f"--assumptions {path}: {problems}") from None


def calibrate(profile: Profile, gpu: GpuType, base: Assumptions | None = None) -> tuple[Assumptions, list[str]]:
    """The factors that reproduce `profile` measured on `gpu` (one replica at tp 1, the trainer
    at its measured world size), and a note per factor: fitted from what, or why kept."""
    base = base or Assumptions()
    shape = profile.model.shape
    if shape is None:
        raise ValueError("--calibrate: the profile has no model shape (measure it again with `streamrl profile`)")
    fitted: dict[str, float] = {}
    notes: list[str] = []
    cost = AnalyticGenerationCost(shape, gpu, 1, profile.ptl_context, base)
    batch, seconds = profile.ptl[0]
    busy = seconds - base.decode_step_overhead_s
    if busy > 0:
        bytes_read = cost.weight_bytes_per_gpu + batch * profile.ptl_context * cost.kv_bytes_per_token_per_gpu
        fitted["decode_bandwidth_efficiency"] = bytes_read / (gpu.hbm_gb_s * 1e9 * busy)
        notes.append(f"decode_bandwidth_efficiency from PTL({batch}) = {seconds * 1e3:.3f} ms")
    else:
        notes.append(f"decode_bandwidth_efficiency kept: PTL({batch}) is within decode_step_overhead_s")
    batch, seconds = profile.ptl[-1]
    memory_s = (cost.weight_bytes_per_gpu + batch * profile.ptl_context * cost.kv_bytes_per_token_per_gpu) / (
        gpu.hbm_gb_s * 1e9 * fitted.get("decode_bandwidth_efficiency", base.decode_bandwidth_efficiency))
    busy = seconds - base.decode_step_overhead_s
    if len(profile.ptl) > 1 and busy > memory_s * 1.05:  # slower than its bytes explain: compute-bound
        flops = batch * shape.forward_flops_per_token(profile.ptl_context)
        fitted["decode_compute_efficiency"] = flops / (gpu.bf16_tflops * 1e12 * busy)
        notes.append(f"decode_compute_efficiency from PTL({batch}) = {seconds * 1e3:.3f} ms")
    else:
        notes.append("decode_compute_efficiency kept: no measured batch size was compute-bound")
    if profile.prefill_s_per_token > 0:
        fitted["prefill_compute_efficiency"] = shape.forward_flops_per_token(0) / (
            gpu.bf16_tflops * 1e12 * profile.prefill_s_per_token)
        notes.append("prefill_compute_efficiency from prefill seconds per token")
    if profile.forward_backward_s_per_token > 0:  # one efficiency for both: a profile's sequences are short
        flops = 3 * shape.forward_flops_per_token(profile.train_sequence_tokens / 2)
        fitted["train_matmul_efficiency"] = flops / (profile.train_world_size * gpu.bf16_tflops * 1e12
                                                     * profile.forward_backward_s_per_token)
        notes.append(f"train_matmul_efficiency (and attention's) from forward/backward seconds per token at "
                     f"micro-batch {profile.train_micro_batch_size}")
    for name in _FACTORS:
        if name in fitted and fitted[name] > 1:
            notes.append(f"{name} fitted {fitted[name]:.2f} > 1, kept at 1: faster than {gpu.name}'s peak "
                         "(is the profile's GPU type right?)")
            fitted[name] = 1.0
    if "train_matmul_efficiency" in fitted:
        fitted["train_attention_efficiency"] = fitted["train_matmul_efficiency"]
    return base.model_copy(update=fitted), notes


# ---- fitting to published measurements (deploy/catalog/measurements.yaml) ------------------

FITTED_TO_MEASUREMENTS = ("decode_bandwidth_efficiency", "decode_compute_efficiency", "decode_step_overhead_s",
                          "prefill_compute_efficiency", "allreduce_latency_s", "decode_allreduce_bandwidth_efficiency")
_BOUNDS = {"decode_bandwidth_efficiency": (0.3, 0.9), "decode_compute_efficiency": (0.05, 0.8),
           "decode_step_overhead_s": (1e-4, 1e-2), "prefill_compute_efficiency": (0.1, 1.0),
           "allreduce_latency_s": (2e-6, 2e-4), "decode_allreduce_bandwidth_efficiency": (0.02, 1.0)}
_REQUEST_OVERHEADS = (0.0, 0.002, 0.004, 0.006, 0.008, 0.010, 0.012)
_CHUNKS = 16


def predict_measurement(row: Measurement, catalog: Catalog, assumptions: Assumptions,
                        request_overhead_s: float = 0.0) -> float:
    """The roofline's seconds for a published measurement: a request is the prefill of the
    batch's prompts, then a decode step per further token at the growing context (summed over
    16 equal spans at their midpoints: the step is piecewise linear in context); each
    measurement also pays `request_overhead_s` (an engine's fixed cost per request: scheduling,
    detokenising, the harness), a nuisance of the fit the planner does not use."""
    cost = AnalyticGenerationCost(catalog.model(row.model), catalog.gpu(row.gpu, f"measurement {row.name}: gpu"),
                                  row.tp, row.input_tokens + row.output_tokens, assumptions, row.input_tokens)
    seconds = request_overhead_s + cost.prefill_s(row.batch * row.input_tokens)
    steps = row.output_tokens - 1  # the first token comes with the prefill
    if row.kind == "request" and steps > 0:
        spans = min(_CHUNKS, steps)
        for k in range(spans):
            context = row.input_tokens + 1 + (k + 0.5) * steps / spans
            seconds += steps / spans * cost.decode_step_s(row.batch, round(context))
    return seconds


def predict_throughput(row: Measurement, catalog: Catalog, assumptions: Assumptions) -> float:
    """The roofline's output tokens/s of a replica at full load (a `throughput` row): as many
    sequences as the KV cache holds at `input_tokens` + `output_tokens` each (the engine's cap
    aside) decode side by side at the mean context of a sequence's life, and each is admitted
    once (its prompt's prefill) per `output_tokens` steps of the batch."""
    cost = AnalyticGenerationCost(catalog.model(row.model), catalog.gpu(row.gpu, f"measurement {row.name}: gpu"),
                                  row.tp, row.input_tokens + row.output_tokens, assumptions, row.input_tokens)
    batch = cost.max_batch
    if batch < 1:
        raise ValueError(f"measurement {row.name}: {cost.memory_problem() or 'no sequence fits'}")
    cycle_s = batch * cost.prefill_s(row.input_tokens) + \
        row.output_tokens * cost.decode_step_s(batch, round(row.input_tokens + row.output_tokens / 2))
    return batch * row.output_tokens / cycle_s


def predicted_over_measured(row: Measurement, catalog: Catalog, assumptions: Assumptions,
                            request_overhead_s: float = 0.0) -> float:
    """The roofline's throughput over the measured one (> 1: the roofline is faster than the
    engine was): output tokens/s for a `throughput` row, 1 / seconds for the others."""
    if row.kind == "throughput":
        assert row.output_tokens_per_s is not None  # the model's validator
        return predict_throughput(row, catalog, assumptions) / row.output_tokens_per_s
    assert row.seconds is not None
    return row.seconds / predict_measurement(row, catalog, assumptions, request_overhead_s)


def fit_measurements(rows: list[Measurement], catalog: Catalog,
                     base: Assumptions | None = None) -> tuple[Assumptions, float]:
    """The decode and prefill factors (FITTED_TO_MEASUREMENTS) and request overhead that make
    the roofline reproduce `rows`, by least squares on log relative error: coordinate descent
    over each factor's plausible range (a 48-point log grid, then a finer one around the best),
    four rounds, for each request overhead of a grid. Only `use: fit` rows count."""
    base = base or Assumptions()
    rows = [r for r in rows if r.use == "fit"]
    if not rows:
        raise ValueError("no measurements to fit (deploy/catalog/measurements.yaml, `use: fit`)")

    def loss(a: Assumptions, overhead: float) -> float:
        return sum(math.log(predicted_over_measured(r, catalog, a, overhead)) ** 2 for r in rows)

    best: tuple[float, Assumptions, float] | None = None
    for overhead in _REQUEST_OVERHEADS:
        a = base
        for _ in range(4):
            for name in FITTED_TO_MEASUREMENTS:
                lo, hi = _BOUNDS[name]
                grid = [lo * (hi / lo) ** (i / 47) for i in range(48)]
                value = min(grid, key=lambda v: loss(a.model_copy(update={name: v}), overhead))
                fine = [value * (1 + d / 100) for d in range(-4, 5)]
                value = min((v for v in fine if lo <= v <= hi), key=lambda v: loss(a.model_copy(update={name: v}),
                                                                                  overhead))
                a = a.model_copy(update={name: value})
        scored = (loss(a, overhead), a, overhead)
        if best is None or scored[0] < best[0]:
            best = scored
    assert best is not None
    return best[1], best[2]


# ---- training, against published throughputs (deploy/catalog/training.yaml) ----------------

def predict_training(row: PublishedTrainingRun, catalog: Catalog, assumptions: Assumptions | None = None) -> float:
    """The roofline's trained tokens/s per GPU for a published training run: `gpus` GPUs of the
    catalog's type (with the efficiencies the catalog fitted) training one sequence each of
    `sequence_tokens`, its tensor parallelism's all-reduces included (the optimizer step, paid
    once per large batch, left out)."""
    cost = analytic_training_cost(
        catalog.model(row.model), catalog.gpu(row.gpu, f"training measurement {row.name}: gpu"), row.gpus,
        row.sequence_tokens, assumptions=assumptions,
        memory=TrainerMemory(activation_checkpointing=row.activation_checkpointing == "full", tensor_parallel=row.tp))
    tokens = row.gpus * row.sequence_tokens
    return tokens / cost.train_s(tokens) / row.gpus


@dataclass(frozen=True)
class CalibrationRow:
    """One published measurement beside the roofline's prediction of it."""

    table: str
    """`training` (deploy/catalog/training.yaml) or `decoding` (measurements.yaml)."""
    name: str
    use: str
    """`fit` or `check` (held out of the fit)."""
    gpu: str
    tp: int
    shape: str
    """What was run, in words (`8 GPUs, 4096 tokens, full checkpointing`; `20000/2000 tokens, throughput`)."""
    ratio: float
    """Predicted over published throughput (> 1: the roofline is faster than the published run)."""

    @property
    def error(self) -> float:
        return abs(self.ratio - 1)


def published_rows(catalog: Catalog, assumptions: Assumptions | None = None) -> list[CalibrationRow]:
    """Every published measurement of the catalog's two tables with the roofline's prediction
    (the catalog's fitted training efficiencies, `assumptions`' serving factors)."""
    assumptions = assumptions or Assumptions()
    checkpointing = {"none": "no", "full": "full", "selective": "selective"}
    rows = [CalibrationRow("training", r.name, r.use, r.gpu, r.tp,
                           f"{r.gpus} GPUs, {r.sequence_tokens} tokens, "
                           f"{checkpointing[r.activation_checkpointing]} checkpointing",
                           predict_training(r, catalog, assumptions) / r.tokens_per_s_per_gpu)
            for r in catalog.training]
    rows += [CalibrationRow("decoding", r.name, r.use, r.gpu, r.tp,
                            f"{r.input_tokens}/{r.output_tokens} tokens, "
                            + ("throughput" if r.kind == "throughput" else f"{r.kind} of {r.batch}"),
                            predicted_over_measured(r, catalog, assumptions))
             for r in catalog.measurements]
    return rows


def error_summary(rows: list[CalibrationRow]) -> dict[str, dict[str, float | int | None]]:
    """{`training_fit`, `training_check`, `decoding_fit`, `decoding_check`: rows, median and
    worst |predicted / published - 1|}."""
    out: dict[str, dict[str, float | int | None]] = {}
    for table in ("training", "decoding"):
        for use in ("fit", "check"):
            errors = [r.error for r in rows if r.table == table and r.use == use]
            out[f"{table}_{use}"] = {"rows": len(errors),
                                     "median_error": round(statistics.median(errors), 3) if errors else None,
                                     "worst_error": round(max(errors), 3) if errors else None}
    return out
