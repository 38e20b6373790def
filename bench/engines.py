"""Engines side by side: vLLM (StreamRL's vLLM engine, vLLM's CPU build) against the torch engine
on the same models, prompts and seeds, each measurement in a process of its own; and what the
generator service costs around vLLM. Prints tables and, as the last line, a JSON object.

    python bench/engines.py [--sections curve service modes] [--models builtin llama-243m] [--batches N ...]
                            [--engines torch vllm] [--modes MODE ...] [--quick] [--out runs/bench-engines]

Sections (all by default; run them one at a time where the whole would take too long):
`curve`: per model and engine, tokens/s at each batch size (temperature 1, no EOS, a warm-up round
first), PTL(BS), the step's linear layers alone as each engine runs them (torch's matmul; vLLM's
oneDNN GEMMs on prepacked weights): their ratio is the most vLLM's GEMMs can gain over the torch
engine's at that batch (`gemm_ceiling_vllm_over_torch`), and a version's load against a plain
in-memory copy of its bytes;
`service`: per model at its largest batch, a `streamrl generator` process on vLLM streaming over gRPC
to a trainer stand-in that only accepts (the real coordinator and intake, reward 0) against vLLM's
own offline `LLM.generate` on the same prompts, seeds and stop token, in vLLM's default layout (the
engine core in a process of its own, bound to the cores) and, for attribution, in process as the
generator runs it;
`modes`: the tiny job (deploy/examples/rljob-tiny-cpu.yaml) in each pipeline mode on each engine,
one `streamrl run` each.

Each invocation writes into a new directory under --out (bench/provenance.py): the models it
builds (models/<name>/, random weights, Hugging Face directories), each probe's result, the
service's job and generator log (service-<model>/), and a run directory per (engine, mode).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.engine_probe import prompt_ids  # noqa: E402
from bench.modes import MODES, job_for  # noqa: E402
from bench.provenance import OUT_HELP, Invocation  # noqa: E402
from streamrl.records import SUMMARY_FILE, RunSummary  # noqa: E402

ENGINES = ["torch", "vllm"]
SECTIONS = ["curve", "service", "modes"]
MODELS = {
    "builtin": {"size": "tiny", "dtype": "float32", "batches": [1, 16, 64, 256], "kv_cache_gib": 0.5},
    "llama-243m": {
        "config": dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                       intermediate_size=3584, max_position_embeddings=256, tie_word_embeddings=True),
        "dtype": "bfloat16", "batches": [1, 16, 64, 256], "kv_cache_gib": 4.0,
    },
}
"""The models the bench builds: `builtin` is the built-in tiny Llama (0.5 M parameters, float32,
as the tiny job trains it); `llama-243m` the same architecture at 243 M parameters (hidden 1024,
16 layers, the built-in's character vocabulary), bfloat16. Random weights: speed does not depend
on them. vLLM's KV cache on CPU is in blocks of 128 tokens, one held back: at 64 KiB per token
(llama-243m), 256 sequences need just over 2 GiB."""
VLLM_POOL = {"type": "vllm", "device": "cpu", "enforceEager": True, "maxNumSeqs": 64, "cpuKvCacheGib": 0.5}
"""The tiny job's pool on vLLM (the torch pool's maxBatchSize is 64 too)."""
GROUP_SIZE = 8
STALL_S = 120.0
"""The service section gives up when no sample is accepted for this long."""
PROBE = ROOT / "bench" / "engine_probe.py"


def child_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- models ---------------------------------------------------------------------------------
def build_model(name: str, out: Path) -> dict:
    """The model `name` as a Hugging Face directory (safetensors in its dtype, the built-in
    character tokenizer beside it for its EOS id); its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from streamrl.models import build_char_tokenizer, build_tiny_model

    m = MODELS[name]
    if "size" in m:
        build_tiny_model(out, seed=0, size=m["size"])
    else:
        tokenizer = build_char_tokenizer()
        config = LlamaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **m["config"])
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(getattr(torch, m["dtype"]))
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    from safetensors import safe_open

    params = 0
    for file in out.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            params += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    return {"parameters": params, "dtype": m["dtype"], "dir": str(out)}


def probe(what: str, result: Path, *args: str) -> dict:
    """engine_probe.py in a fresh process, its output (vLLM's log included) in <result>.log; its
    JSON result."""
    with result.with_suffix(".log").open("w") as log:
        done = subprocess.run([sys.executable, str(PROBE), what, *args, "--result", str(result)], env=child_env(),
                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"engine_probe.py {what} exited with {done.returncode}: see {log.name}")
    return json.loads(result.read_text())


# ---- curve ----------------------------------------------------------------------------------
def curve(model: str, info: dict, batches: list[int], engines: list[str], args, inv: Invocation) -> dict:
    """Each engine's curve in `args.repeats` fresh processes, the engines' order alternating
    (torch vllm vllm torch ...) so drift on a shared machine hits both alike; per batch size the
    best tokens/s and PTL, and the median version load and copy over all repeats."""
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for k in range(args.repeats):
        for engine in engines if k % 2 == 0 else engines[::-1]:
            say(f"curve: {model} on {engine}, batches {batches} (repeat {k + 1} of {args.repeats})")
            c = probe("curve", inv.dir / f"curve-{model}-{engine}-{k}.json", "--engine", engine,
                      "--model-dir", info["dir"], "--dtype", info["dtype"],
                      "--batches", *map(str, batches), "--new-tokens", str(args.new_tokens),
                      "--prompt-tokens", str(args.prompt_tokens), "--threads", str(args.threads),
                      "--kv-cache-gib", str(MODELS[model]["kv_cache_gib"]))
            say("  " + ", ".join(f"{b}: {c['tokens_per_s'][str(b)]:.0f}" for b in batches) + " tokens/s; a version "
                f"loads in {c['weight_load_s']:.3f} s, a copy {c['copy_s']:.3f} s")
            runs[engine].append(c)
    return {e: {
        "tokens_per_s": {str(b): max(c["tokens_per_s"][str(b)] for c in cs) for b in batches},
        "ptl_s": {str(b): min(c["ptl_s"][str(b)] for c in cs) for b in batches},
        "linear_s": {str(b): min(c["linear_s"][str(b)] for c in cs) for b in batches},
        "weight_load_s": statistics.median(s for c in cs for s in c["weight_load_s_each"]),
        "copy_s": statistics.median(s for c in cs for s in c["copy_s_each"]),
        "weight_bytes": cs[0]["weight_bytes"], "start_s": min(c["start_s"] for c in cs),
        "tokens_per_s_each": [c["tokens_per_s"] for c in cs],
    } for e, cs in runs.items()}


# ---- service --------------------------------------------------------------------------------
def service(model: str, info: dict, batch: int, args, inv: Invocation) -> dict:
    """The generator service at `batch` against vLLM offline on the same requests, in both layouts,
    `args.repeats` rounds with the order reversed every other round (service first, then last);
    each figure the best of its rounds."""
    work = inv.dir / f"service-{model}"
    work.mkdir()
    served, offline = [], {"multiprocess": [], "in-process": []}
    for k in range(args.repeats):
        order = ["service", "multiprocess", "in-process"]
        for what in order if k % 2 == 0 else order[::-1]:
            if what == "service":
                served.append(serve(model, info, batch, args, work, k))
            else:
                offline[what].append(offline_run(model, info, batch, args, work, what, k))
    best = max(served, key=lambda s: s["tokens_per_s"])
    mp, ip = (max(runs, key=lambda o: o["tokens_per_s"]) for runs in offline.values())
    out = {"batch": batch, "samples": best["samples"], "service_tokens": best["tokens"], "service_s": best["seconds"],
           "service_tokens_per_s": best["tokens_per_s"], "offline_tokens": mp["generated_tokens"],
           "offline_s": mp["seconds"], "offline_tokens_per_s": mp["tokens_per_s"],
           "offline_in_process_tokens_per_s": ip["tokens_per_s"], "offline_in_process_tokens": ip["generated_tokens"],
           "served_ptl_ms": best["served_ptl_ms"],
           "service_tokens_per_s_each": [round(s["tokens_per_s"], 1) for s in served],
           "offline_tokens_per_s_each": {layout: [round(o["tokens_per_s"], 1) for o in runs]
                                         for layout, runs in offline.items()}}
    say(f"  best: service {out['service_tokens_per_s']:.1f} tokens/s; vLLM offline {out['offline_tokens_per_s']:.1f} "
        f"(in process {out['offline_in_process_tokens_per_s']:.1f})")
    return out


def serve(model: str, info: dict, batch: int, args, work: Path, k: int) -> dict:
    """A `streamrl generator` process on vLLM (maxNumSeqs `batch`) fed by a trainer stand-in that
    only accepts: a warm-up batch, then --service-rounds batches timed from handing out the work to
    the last sample accepted. Writes the requests (prompts, the coordinator's seeds) for offline."""
    from streamrl.rollout.work import PromptWork, SamplingConfig
    from streamrl.weights import WeightStore
    from tests.integration.inproc import TrainerServer

    job = job_for("stream-sync", 1, 1)
    job["metadata"]["name"] = f"bench-service-{model}"
    job["spec"]["model"] = {"source": "path", "path": info["dir"], "dtype": info["dtype"]}
    job["spec"]["generators"]["pools"] = [{
        "name": "default", "replicas": 1, "threads": args.threads,
        "engine": {**VLLM_POOL, "maxNumSeqs": batch, "cpuKvCacheGib": MODELS[model]["kv_cache_gib"]}}]
    job_file = work / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))

    accepted: list[tuple[float, int]] = []  # (monotonic seconds, tokens) of each sample, on the trainer's loop

    def scorer(sample, answer: str) -> float:
        accepted.append((time.monotonic(), len(sample.completion_token_ids)))
        return 0.0

    say(f"service: {model} at batch {batch}: the generator (round {k + 1})")
    trainer = TrainerServer(WeightStore(1, 1 << 20), sampling=SamplingConfig(1.0, 1.0, args.new_tokens, 0),
                            scorer=scorer)
    log = (work / f"generator-{k}.log").open("w")
    generator = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli", "generator", str(job_file), "--trainer", f"127.0.0.1:{trainer.port}",
         "--model-dir", info["dir"], "--id", "bench-0"], stdout=log, stderr=subprocess.STDOUT, env=child_env(),
        cwd=ROOT)
    try:
        while trainer.num_connected() < 1:
            if generator.poll() is not None:
                raise RuntimeError(f"the generator exited with {generator.returncode}: see {log.name}")
            time.sleep(0.1)

        def iteration(it: int, num_samples: int) -> tuple[list[PromptWork], list[int], float]:
            prompts = [PromptWork(f"{it}-{j}", j, "", prompt_ids(j, args.prompt_tokens))
                       for j in range(num_samples // GROUP_SIZE)]
            done = len(accepted) + len(prompts) * GROUP_SIZE

            def add() -> list[int]:
                trainer.coordinator.add_prompts(it, prompts, GROUP_SIZE, 0)
                return [trainer.coordinator.book.get(p.prompt_id).seed for p in prompts]

            t0 = time.monotonic()
            seeds = trainer.on_loop(add)
            seen, since = len(accepted), time.monotonic()
            while len(accepted) < done:
                if generator.poll() is not None:
                    raise RuntimeError(f"the generator exited with {generator.returncode}: see {log.name}")
                if len(accepted) > seen:
                    seen, since = len(accepted), time.monotonic()
                elif time.monotonic() - since > STALL_S:
                    refused = trainer.on_loop(lambda: dict(trainer.coordinator.counters.num_samples_refused))
                    raise RuntimeError(f"no sample accepted for {STALL_S:.0f} s ({seen} of {done}); refused: {refused}")
                time.sleep(0.01)
            return prompts, seeds, t0

        iteration(0, batch)
        first = len(accepted)
        prompts, seeds, t0 = iteration(1, args.service_rounds * batch)
        tokens = sum(n for _, n in accepted[first:])
        seconds = accepted[-1][0] - t0
        # The replica's PTL(BS) as it served (its latest load report): its decode steps' own seconds.
        served = trainer.on_loop(lambda: list(trainer.coordinator.replicas["bench-0"].latency_profile))
    finally:
        trainer.stop()  # the trainer's goodbye: the generator exits 0
        try:
            generator.wait(60)
        except subprocess.TimeoutExpired:
            generator.kill()
        log.close()
    if generator.returncode:
        raise RuntimeError(f"the generator exited with {generator.returncode}: see {log.name}")
    requests = [{"prompt": list(p.token_ids), "seed": seed + i}
                for p, seed in zip(prompts, seeds) for i in range(GROUP_SIZE)]
    file = work / "requests.json"
    if file.exists() and json.loads(file.read_text()) != requests:
        raise RuntimeError("the coordinator handed out other requests than in an earlier round")
    file.write_text(json.dumps(requests))
    say(f"  {tokens / seconds:.1f} tokens/s")
    return {"samples": len(requests), "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "served_ptl_ms": {int(b): round(t * 1e3, 2) for b, t in served}}


def offline_run(model: str, info: dict, batch: int, args, work: Path, layout: str, k: int) -> dict:
    """vLLM's own LLM.generate on the service's requests (engine_probe.py offline)."""
    from streamrl.models import eos_token_id

    say(f"service: {model} at batch {batch}: vLLM offline, {layout} (round {k + 1})")
    out = probe("offline", work / f"offline-{layout}-{k}.json", "--layout", layout, "--model-dir", info["dir"],
                "--dtype", info["dtype"], "--batch", str(batch), "--requests", str(work / "requests.json"),
                "--stop-token-id", str(eos_token_id(info["dir"])), "--new-tokens", str(args.new_tokens),
                "--threads", str(args.threads), "--kv-cache-gib", str(MODELS[model]["kv_cache_gib"]))
    say(f"  {out['tokens_per_s']:.1f} tokens/s")
    return out


# ---- modes ----------------------------------------------------------------------------------
def run_mode(engine: str, mode: str, args, inv: Invocation) -> float:
    job = job_for(mode, args.mode_iterations, args.prompts_per_step)
    job["metadata"]["name"] = f"bench-{engine}-{mode}"
    if engine == "vllm":
        job["spec"]["generators"]["pools"][0]["engine"] = dict(VLLM_POOL)
    job_file = inv.dir / f"{engine}-{mode}.yaml"
    job_file.write_text(yaml.safe_dump(job))
    run_dir = inv.run_dir(f"{engine}-{mode}")
    say(f"modes: {mode} on {engine}")
    subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job_file), "--out", str(run_dir), "--quiet"],
                   check=True, env=child_env(), cwd=ROOT)
    return RunSummary.read(run_dir / SUMMARY_FILE).samples_per_s


# ---- the report -----------------------------------------------------------------------------
def r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def report(args, models: dict, curves: dict, services: dict, modes: dict) -> dict:
    tokens = {m: {e: {int(b): r(v, 1) for b, v in c["tokens_per_s"].items()} for e, c in cs.items()}
              for m, cs in curves.items()}
    ratio = {m: {b: r(tokens[m]["vllm"][b] / tokens[m]["torch"][b]) for b in tokens[m]["torch"]}
             for m in tokens if {"torch", "vllm"} <= set(tokens[m])}
    linear = {m: {e: {int(b): r(v * 1e3) for b, v in c["linear_s"].items()} for e, c in cs.items()}
              for m, cs in curves.items()}
    ceiling = {m: {b: r(linear[m]["torch"][b] / linear[m]["vllm"][b]) for b in linear[m]["torch"]}
               for m in linear if {"torch", "vllm"} <= set(linear[m])}
    load = {m: {e: r(c["weight_load_s"], 4) for e, c in cs.items()} for m, cs in curves.items()}
    over_copy = {m: {e: r(c["weight_load_s"] / c["copy_s"], 2) for e, c in cs.items()} for m, cs in curves.items()}
    big = [m for m, info in models.items() if info["parameters"] >= 200e6]
    targets = {
        "vllm_1_5x_torch_at_largest_batch": {m: ratio[m][max(ratio[m])] >= 1.5 for m in big if m in ratio},
        "service_over_offline_vllm_0_9": {m: s["service_tokens_per_s"] / s["offline_tokens_per_s"] >= 0.9
                                          for m, s in services.items() if m in big},
        "weight_load_within_3x_copy": {m: over_copy[m]["vllm"] <= 3 for m in big if "vllm" in over_copy.get(m, {})},
    }
    samples = {e: {mode: r(s, 1) for mode, s in ms.items()} for e, ms in modes.items()}
    return {
        "models": {m: {"parameters": i["parameters"], "dtype": i["dtype"]} for m, i in models.items()},
        "tokens_per_s": tokens,
        "vllm_over_torch_tokens_per_s": ratio,
        "ptl_ms": {m: {e: {int(b): r(v * 1e3) for b, v in c["ptl_s"].items()} for e, c in cs.items()}
                   for m, cs in curves.items()},
        "linear_ms": linear,
        "gemm_ceiling_vllm_over_torch": ceiling,
        "weight_load_s": load,
        "weight_copy_s": {m: {e: r(c["copy_s"], 4) for e, c in cs.items()} for m, cs in curves.items()},
        "weight_load_over_copy": over_copy,
        "weight_mb": {m: r(next(iter(cs.values()))["weight_bytes"] / 1e6, 1) for m, cs in curves.items()},
        "engine_start_s": {m: {e: r(c["start_s"], 1) for e, c in cs.items()} for m, cs in curves.items()},
        "service": {m: {k: r(v, 2) if isinstance(v, float) else v for k, v in s.items()} for m, s in services.items()},
        "service_over_offline_vllm": {m: r(s["service_tokens_per_s"] / s["offline_tokens_per_s"])
                                      for m, s in services.items()},
        "service_over_offline_vllm_in_process": {m: r(s["service_tokens_per_s"] / s["offline_in_process_tokens_per_s"])
                                                 for m, s in services.items()},
        "samples_per_s": samples,
        "vllm_over_torch_samples_per_s": {mode: r(modes["vllm"][mode] / modes["torch"][mode])
                                          for mode in modes.get("torch", {}) if mode in modes.get("vllm", {})},
        "targets": targets,
        "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_tokens, "threads": args.threads,
        "mode_iterations": args.mode_iterations, "prompts_per_step": args.prompts_per_step,
        "load_average_at_start": args.load_average,
    }


def print_tables(result: dict) -> None:
    for m, engines in result["tokens_per_s"].items():
        print(f"\n{m} ({result['models'][m]['parameters'] / 1e6:.1f} M parameters, {result['models'][m]['dtype']}): "
              f"tokens/s and PTL ms by batch size")
        heads = " ".join(f"{e + ' tok/s':>12} {e + ' PTL':>10} {e + ' linear':>13}" for e in engines)
        print(f"{'batch':>6} {heads} {'vllm/torch':>11} {'GEMM ceiling':>13}")
        for b in next(iter(engines.values())):
            row = " ".join(f"{engines[e][b]:>12.1f} {result['ptl_ms'][m][e][b]:>10.2f} "
                           f"{result['linear_ms'][m][e][b]:>13.2f}" for e in engines)
            x = result["vllm_over_torch_tokens_per_s"].get(m, {}).get(b)
            c = result["gemm_ceiling_vllm_over_torch"].get(m, {}).get(b)
            print(f"{b:>6} {row} {'-' if x is None else f'{x:.2f}':>11} {'-' if c is None else f'{c:.2f}':>13}")
        for e in engines:
            print(f"  {e}: a version ({result['weight_mb'][m]} MB) loads in {result['weight_load_s'][m][e]:.3f} s, "
                  f"{result['weight_load_over_copy'][m][e]:.2f}x a plain copy ({result['weight_copy_s'][m][e]:.3f} s)")
    for m, s in result["service"].items():
        print(f"\nservice vs vLLM offline, {m} at batch {s['batch']}, {s['samples']} samples: "
              f"{s['service_tokens_per_s']:.1f} vs {s['offline_tokens_per_s']:.1f} tokens/s "
              f"({result['service_over_offline_vllm'][m]:.3f}; in process {s['offline_in_process_tokens_per_s']:.1f}); "
              f"tokens {s['service_tokens']} vs {s['offline_tokens']}")
    if result["samples_per_s"]:
        print(f"\n{'mode':<13}" + "".join(f"{e + ' samples/s':>18}" for e in result["samples_per_s"]))
        modes = sorted({mode for ms in result["samples_per_s"].values() for mode in ms}, key=MODES.index)
        for mode in modes:
            cells = "".join(f"{ms.get(mode, float('nan')):>18.1f}" for ms in result["samples_per_s"].values())
            print(f"{mode:<13}{cells}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=SECTIONS)
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--batches", type=int, nargs="+",
                   help="batch sizes of the curve, every model (default: 1 16 64 256); the service runs at the largest")
    p.add_argument("--engines", nargs="+", choices=ENGINES, default=ENGINES, help="the curve's and the modes' engines")
    p.add_argument("--modes", nargs="+", choices=MODES, default=MODES, metavar="MODE")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens each request generates (default 64)")
    p.add_argument("--prompt-tokens", type=int, default=5, help="prompt tokens, BOS included (default 5)")
    p.add_argument("--repeats", type=int, default=2,
                   help="curve runs per engine, the engines' order alternating; each figure is the best (default 2)")
    p.add_argument("--service-rounds", type=int, default=4,
                   help="the service's samples, in batches: rounds x its batch (default 4)")
    p.add_argument("--mode-iterations", type=int, default=10, help="the tiny job's iterations per mode (default 10)")
    p.add_argument("--prompts-per-step", type=int, default=32, help="the tiny job's prompts per step (default 32)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="cores of each engine in the curve and the service (default: all this process may use)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: the built-in model at batches 1 and 16, 16 new tokens, stream-sync alone, "
                        "2 iterations of 4 prompts (about 3 minutes)")
    p.add_argument("--out", default="runs/bench-engines", help=OUT_HELP)
    args = p.parse_args()
    if args.quick:
        args.models, args.batches, args.new_tokens, args.modes = ["builtin"], [1, 16], 16, ["stream-sync"]
        args.mode_iterations, args.prompts_per_step, args.service_rounds, args.repeats = 2, 4, 2, 1
    args.load_average = round(os.getloadavg()[0], 2)
    if args.load_average > 0.5:
        say(f"warning: load average {args.load_average} at start: other work shares these cores")
    inv = Invocation(args.out)
    models = {m: build_model(m, inv.dir / "models" / m) for m in args.models}
    batches = {m: sorted(args.batches or MODELS[m]["batches"]) for m in args.models}
    curves = {m: curve(m, models[m], batches[m], args.engines, args, inv) for m in args.models} \
        if "curve" in args.sections else {}
    services = {m: service(m, models[m], batches[m][-1], args, inv) for m in args.models} \
        if "service" in args.sections else {}
    modes = {e: {mode: run_mode(e, mode, args, inv) for mode in MODES if mode in args.modes} for e in args.engines} \
        if "modes" in args.sections else {}
    result = report(args, models, curves, services, modes)
    print_tables(result)
    print(inv.report(result))


if __name__ == "__main__":
    main()
