"""(helper of bench/engines.py) One engine measured in a process of its own, started fresh for
that measurement; the result is written as JSON to --result.

    python bench/engine_probe.py curve --engine vllm --model-dir DIR --dtype bfloat16 --batches 1 16 64 --result r.json
    python bench/engine_probe.py offline --model-dir DIR --dtype bfloat16 --batch 64 --requests q.json --result r.json

`curve`: the torch engine or StreamRL's vLLM engine (streamrl/generator/vllm_engine.py) at each
batch size: one round of that many requests (--prompt-tokens prompts, --new-tokens each,
temperature 1, no EOS) after a short warm-up round, its tokens/s; the engine's PTL(BS)
(measure_latency); the step's linear layers alone as the engine runs them (linear_seconds); then
loading a version (Engine.load_weights of the model's own tensors) against a plain copy of the
same bytes in memory (torch clone), interleaved, medians. `offline`: vLLM's own `LLM.generate` on a
list of requests (prompts, seeds, a stop token), as vLLM's users run it, its tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BOS = 1
"""The built-in tokenizer's <bos>; the bench's models share its vocabulary."""


def prompt_ids(k: int, prompt_tokens: int) -> tuple[int, ...]:
    """Prompt k: BOS and prompt_tokens - 1 ordinary ids (4..63, valid in any of the bench's
    vocabularies), different prompts differing early (no shared prefix beyond BOS)."""
    return (BOS, *(4 + (7 * k + 3 * j) % 60 for j in range(prompt_tokens - 1)))


def vllm_spec(batch: int, kv_cache_gib: float):
    from streamrl.spec import VllmEngineSpec

    return VllmEngineSpec(device="cpu", enforce_eager=True, max_num_seqs=batch, cpu_kv_cache_gib=kv_cache_gib)


# ---- curve --------------------------------------------------------------------------------
def build_engine(engine: str, model_dir: str, dtype: str, capacity: int, max_len: int, threads: int,
                 kv_cache_gib: float):
    if engine == "torch":
        from streamrl.generator.torch_engine import TorchEngine
        from streamrl.models import load_model

        return TorchEngine(load_model(model_dir, dtype), capacity, eos_token_id=None, max_len=max_len)
    from streamrl.generator.vllm_engine import VllmEngine

    return VllmEngine(vllm_spec(capacity, kv_cache_gib), model_dir, dtype, eos_token_id=None, threads=threads)


def run_round(engine, batch: int, prompt_tokens: int, new_tokens: int, tag: str) -> tuple[int, float]:
    """`batch` requests at once, run to completion: (tokens generated, seconds)."""
    from streamrl.generator.engine import GenerationRequest

    before = engine.stats().num_generated_tokens
    t0 = time.perf_counter()
    for i in range(batch):
        engine.add_request(GenerationRequest(f"{tag}-{i}", prompt_ids(i, prompt_tokens), new_tokens, 1.0, 1.0, seed=i))
    while engine.has_unfinished():
        engine.step()
    return engine.stats().num_generated_tokens - before, time.perf_counter() - t0


def weight_load(engine, model_dir: str, rounds: int) -> dict:
    """Engine.load_weights of a version (the model's own tensors, as a replica receives them)
    against torch clones of the same tensors (a plain copy of its bytes), interleaved."""
    import torch
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    copies, loads = [], []
    for version in range(1, rounds + 1):
        t0 = time.perf_counter()
        copy = {name: t.clone() for name, t in tensors.items()}
        copies.append(time.perf_counter() - t0)
        del copy
        t0 = time.perf_counter()
        engine.load_weights(tensors.items(), version)
        loads.append(time.perf_counter() - t0)
    return {"weight_bytes": size, "weight_load_s": statistics.median(loads), "copy_s": statistics.median(copies),
            "weight_load_s_each": loads, "copy_s_each": copies}


def linear_seconds(engine, kind: str, batches: list[int], repeats: int) -> dict[int, float]:
    """Seconds per decode step of the model's linear layers alone (the projections and the
    LM head) at each batch size, as this engine runs them: the torch engine's `nn.Linear`s
    (torch's matmul on the weights as loaded), vLLM's layers through their own
    `quant_method.apply` (on CPU its oneDNN GEMMs on prepacked, fused weights), called on the
    layer objects inside the running engine. One row per sequence, as a decode step has; the
    median of `repeats` after a warm-up. The GEMM ceiling of one engine over the other is the
    ratio of these."""
    import torch

    def time_layers(layers: list[tuple[torch.nn.Module, int]], apply, dtype) -> dict[int, float]:
        out = {}
        for batch in batches:
            inputs = [torch.randn(batch, width, dtype=dtype) for _, width in layers]
            seconds = []
            for k in range(repeats + 1):
                t0 = time.perf_counter()
                with torch.inference_mode():
                    for (layer, _), x in zip(layers, inputs):
                        apply(layer, x)
                if k:
                    seconds.append(time.perf_counter() - t0)
            out[batch] = statistics.median(seconds)
        return out

    if kind == "torch":  # its model's Linear layers
        linears = [(m, m.in_features) for m in engine.model.modules() if isinstance(m, torch.nn.Linear)]
        dtype = next(engine.model.parameters()).dtype
        return time_layers(linears, lambda m, x: torch.nn.functional.linear(x, m.weight, m.bias), dtype)

    def in_worker(worker) -> dict[int, float]:  # vLLM: runs on its (in-process) worker
        model = worker.model_runner.model
        layers = [(m, m.input_size_per_partition) for m in model.modules()
                  if hasattr(m, "quant_method") and hasattr(m, "input_size_per_partition")]
        head = model.lm_head  # the logits: vLLM's LogitsProcessor applies the head's quant_method
        layers.append((head, head.embedding_dim))
        return time_layers(layers, lambda m, x: m.quant_method.apply(m, x), layers[0][0].weight.dtype)

    return engine._llm.collective_rpc(in_worker)[0]


def curve(args) -> dict:
    from streamrl import compute

    compute.set_threads(args.threads)

    def measure() -> dict:
        t0 = time.perf_counter()
        engine = build_engine(args.engine, args.model_dir, args.dtype, max(args.batches),
                              args.prompt_tokens + args.new_tokens + 64, args.threads, args.kv_cache_gib)
        out = {"engine": args.engine, "start_s": time.perf_counter() - t0, "tokens_per_s": {}, "generated_tokens": {},
               "ptl_s": {}}
        for batch in args.batches:
            run_round(engine, batch, args.prompt_tokens, 4, f"warm-{batch}")
            tokens, seconds = run_round(engine, batch, args.prompt_tokens, args.new_tokens, f"run-{batch}")
            out["tokens_per_s"][batch] = tokens / seconds
            out["generated_tokens"][batch] = tokens
            out["ptl_s"][batch] = dict(engine.measure_latency([batch], steps=args.ptl_steps))[batch]
            print(f"  {args.engine} batch {batch}: {tokens / seconds:.0f} tokens/s, PTL "
                  f"{out['ptl_s'][batch] * 1e3:.2f} ms", file=sys.stderr, flush=True)
        out["linear_s"] = linear_seconds(engine, args.engine, args.batches, args.ptl_steps)
        out.update(weight_load(engine, args.model_dir, args.load_rounds))
        return out

    return compute.run(measure, name="engine")


# ---- vLLM offline ---------------------------------------------------------------------------
def offline(args) -> dict:
    """vLLM's LLM with the same engine arguments and sampling parameters StreamRL's engine uses
    (vllm_args.engine_kwargs, the sampled token's logprob, the stop token), in one of two layouts:
    `multiprocess`, vLLM's default (the engine core in a process of its own, its OpenMP threads
    bound to the --threads cores this process may run on, none reserved), or `in-process` (the
    engine core on this process's compute thread with --threads torch threads, as StreamRL runs it,
    the count kept across vLLM's start as VllmEngine keeps it)."""
    cores = sorted(os.sched_getaffinity(0))[:args.threads]
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    if args.layout == "in-process":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from streamrl import compute

        compute.set_threads(args.threads)
        return compute.run(_offline, args, name="engine")
    return _offline(args)


def _offline(args) -> dict:
    from vllm import LLM, SamplingParams, TokensPrompt

    from streamrl.generator.vllm_engine import _threads_kept
    from streamrl.vllm_args import engine_kwargs

    requests = json.loads(Path(args.requests).read_text())
    t0 = time.perf_counter()
    with _threads_kept():
        llm = LLM(**engine_kwargs(vllm_spec(args.batch, args.kv_cache_gib), args.model_dir, args.dtype, 0, True))
    start_s = time.perf_counter() - t0

    def params(seed: int, new_tokens: int) -> SamplingParams:
        stop = [] if args.stop_token_id is None else [args.stop_token_id]
        return SamplingParams(temperature=1.0, top_p=1.0, max_tokens=new_tokens, seed=seed, logprobs=0,
                              stop_token_ids=stop, ignore_eos=True)

    prompts = [TokensPrompt(prompt_token_ids=r["prompt"]) for r in requests]
    warm = min(len(prompts), args.batch)
    llm.generate(prompts[:warm], [params(r["seed"], 4) for r in requests[:warm]], use_tqdm=False)
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, [params(r["seed"], args.new_tokens) for r in requests], use_tqdm=False)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"layout": args.layout, "start_s": start_s, "tokens_per_s": tokens / seconds, "generated_tokens": tokens,
            "seconds": seconds, "num_requests": len(requests)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("curve", "offline"):
        s = sub.add_parser(name)
        s.add_argument("--model-dir", required=True)
        s.add_argument("--dtype", required=True)
        s.add_argument("--prompt-tokens", type=int, default=5)
        s.add_argument("--new-tokens", type=int, default=64)
        s.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
        s.add_argument("--kv-cache-gib", type=float, default=1.0)
        s.add_argument("--result", required=True)
    s = sub.choices["curve"]
    s.add_argument("--engine", choices=["torch", "vllm"], required=True)
    s.add_argument("--batches", type=int, nargs="+", required=True)
    s.add_argument("--ptl-steps", type=int, default=8)
    s.add_argument("--load-rounds", type=int, default=3)
    s = sub.choices["offline"]
    s.add_argument("--batch", type=int, required=True, help="vLLM's max_num_seqs")
    s.add_argument("--requests", required=True, help="JSON list of {prompt: [ids], seed}")
    s.add_argument("--stop-token-id", type=int)
    s.add_argument("--layout", choices=["multiprocess", "in-process"], default="multiprocess")
    args = p.parse_args()
    result = curve(args) if args.what == "curve" else offline(args)
    Path(args.result).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
