"""Calibrating the roofline from a measured profile: the efficiency factors that make the
analytic model reproduce what `streamrl profile` measured on a catalog GPU, so GPU types
without a profile of their own are predicted with this software stack's measured efficiency.
Knows the two models' formulas; fits one factor per measurement, the rest stay assumed."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from streamrl.planning.catalog import GpuType
from streamrl.planning.profile import Profile
from streamrl.planning.roofline import AnalyticGenerationCost, Assumptions

_FACTORS = ("decode_bandwidth_efficiency", "decode_compute_efficiency", "prefill_compute_efficiency", "train_mfu")


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
    if profile.forward_backward_s_per_token > 0:
        flops = 3 * shape.forward_flops_per_token(profile.train_sequence_tokens / 2)
        fitted["train_mfu"] = flops / (profile.train_world_size * gpu.bf16_tflops * 1e12
                                       * profile.forward_backward_s_per_token)
        notes.append(f"train_mfu from forward/backward seconds per token at micro-batch "
                     f"{profile.train_micro_batch_size}")
    for name in _FACTORS:
        if name in fitted and fitted[name] > 1:
            notes.append(f"{name} fitted {fitted[name]:.2f} > 1, kept at 1: faster than {gpu.name}'s peak "
                         "(is the profile's GPU type right?)")
            fitted[name] = 1.0
    return base.model_copy(update=fitted), notes
