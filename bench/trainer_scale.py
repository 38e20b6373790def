"""The sharded trainer side by side: the built-in `small` model (~34 M parameters, the tiny
model's architecture), the same batch of scored samples, trained by 1 rank and by 2 ranks
(FSDP2 over gloo; each rank one thread on a core of its own). Reports per rank the bytes
of parameters + gradients + optimizer state it holds, trained tokens/s, and the seconds to
gather the whole weights to rank 0 and publish them (serialize, chunk, checksum) per step.

Targets: 2 ranks hold <= 0.6x the bytes of 1 rank (the reason FSDP exists) and train >= 1.4x
its tokens/s. The last line is a JSON object.

The two are measured side by side in --rounds rounds, the order swapped every round (1 then 2,
2 then 1, ...), and each figure is the best of its rounds: on a shared 2-core machine one run
of the same commit ranged from 1.10x to 1.82x (the host's other work slows a phase of a run,
and 2 ranks, each waiting for the other at every collective, feel it most), so a single pair
measures the machine's moment more than the trainer. Every round's figures are reported too.

    python bench/trainer_scale.py [--rounds 3] [--steps 4] [--samples 16] [--tokens 128]
                                  [--out runs/bench-trainer-scale]

Each invocation writes into a new directory under --out (bench/provenance.py): ranks-<n>-r<round>/,
each with rank 0's result.json (the model itself is built in a temporary directory, removed after).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import OUT_HELP, Invocation  # noqa: E402
from streamrl.models import build_tiny_model, load_model  # noqa: E402
from streamrl.samples import Group, Sample, ScoredSample  # noqa: E402
from streamrl.spec import AlgorithmSpec  # noqa: E402
from streamrl.trainer.learner import Learner  # noqa: E402
from streamrl.trainer.ranks import Ranks  # noqa: E402
from streamrl.weights import WeightStore  # noqa: E402


def batch(samples: int, tokens: int, seed: int) -> list[Group]:
    """One step's scored groups of 4: prompts of 16 tokens, completions of `tokens`."""
    rng = random.Random(seed)
    groups = []
    for g in range(samples // 4):
        scored = tuple(ScoredSample(Sample(f"p{g}", i, tuple(rng.randrange(4, 60) for _ in range(tokens)),
                                           tuple(-rng.random() for _ in range(tokens)), 0, "length"),
                                    rng.random(), rng.uniform(-1, 1)) for i in range(4))
        groups.append(Group(f"p{g}", 0, g, (1, *[rng.randrange(4, 60) for _ in range(15)]), scored))
    return groups


def held_bytes(learner: Learner) -> int:
    """This rank's parameters, gradients and optimizer state, in bytes (its shards only)."""
    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    total = 0
    for p in learner.model.parameters():
        total += local(p).numel() * local(p).element_size()
        if p.grad is not None:
            total += local(p.grad).numel() * local(p.grad).element_size()
    for state in learner.optimizer.state.values():
        total += sum(local(v).numel() * local(v).element_size() for v in state.values()
                     if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total


def rank_main(rank: int, world_size: int, port: int, model_dir: str, args, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    os.sched_setaffinity(0, [rank % os.cpu_count()])
    ranks = Ranks.from_environment(timeout_s=600)
    algo = AlgorithmSpec(microBatchSize=args.samples, learningRate=1e-5)
    learner = Learner(load_model(model_dir), algo, ranks=ranks)
    if not ranks.is_leader:
        learner.follow()
        ranks.close()
        return
    store = WeightStore(2, 1 << 20)
    steps, publishes, memory = [], [], 0
    for k in range(args.steps + 1):  # the first is a warm-up
        groups = batch(args.samples, args.tokens, k)
        t0 = time.perf_counter()
        learner.accumulate(groups, args.samples)
        forward_backward_s = time.perf_counter() - t0
        memory = max(memory, held_bytes(learner))  # with the gradients (and the optimizer state from step 2)
        t1 = time.perf_counter()
        learner.step()
        t2 = time.perf_counter()
        store.publish(learner.policy_version, learner.weights())
        t3 = time.perf_counter()
        if k:
            steps.append(forward_backward_s + t2 - t1)
            publishes.append(t3 - t2)
    learner.stop()
    tokens = args.samples * (16 + args.tokens)
    step_s = sorted(steps)[len(steps) // 2]
    Path(out).write_text(json.dumps({"held_bytes_rank0": memory, "tokens_per_s": tokens / step_s, "step_s": step_s,
                                     "gather_publish_s": sorted(publishes)[len(publishes) // 2]}))
    ranks.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of both, the order swapped each round (default 3)")
    p.add_argument("--steps", type=int, default=4, help="measured optimizer steps (after one warm-up)")
    p.add_argument("--samples", type=int, default=16, help="samples per step (one micro-batch per rank)")
    p.add_argument("--tokens", type=int, default=128, help="completion tokens per sample")
    p.add_argument("--out", default="runs/bench-trainer-scale", help=OUT_HELP)
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    inv = Invocation(args.out)
    rounds: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="bench-trainer-scale-") as work:
        model_dir = build_tiny_model(Path(work) / "small", seed=0, size="small")
        params = sum(t.numel() for t in load_model(model_dir).parameters())
        for r in range(args.rounds):
            for world_size in ((1, 2) if r % 2 == 0 else (2, 1)):
                print(f"round {r + 1}/{args.rounds}, {world_size} rank(s): {args.steps} steps of {args.samples} x "
                      f"{16 + args.tokens} tokens", file=sys.stderr, flush=True)
                run_dir = inv.run_dir(f"ranks-{world_size}-r{r}")
                run_dir.mkdir()
                out = run_dir / "result.json"
                mp.spawn(rank_main, args=(world_size, free_port(), str(model_dir), args, str(out)),
                         nprocs=world_size, join=True)
                rounds[world_size].append(json.loads(out.read_text()))
                print(f"  {rounds[world_size][-1]['tokens_per_s']:.1f} tokens/s", file=sys.stderr, flush=True)
    results = {n: max(rs, key=lambda x: x["tokens_per_s"]) for n, rs in rounds.items()}
    one, two = results[1], results[2]
    print(f"{'ranks':>5} {'held MB/rank':>13} {'tokens/s (best)':>16} {'each round':>24} {'step s':>7} "
          f"{'gather+publish s':>17}")
    for n, r in results.items():
        each = " ".join(f"{x['tokens_per_s']:.0f}" for x in rounds[n])
        print(f"{n:>5} {r['held_bytes_rank0'] / 1e6:>13.1f} {r['tokens_per_s']:>16.1f} {each:>24} {r['step_s']:>7.2f} "
              f"{r['gather_publish_s']:>17.2f}")
    print(inv.report({
        "parameters": params,
        "held_bytes_per_rank": {n: r["held_bytes_rank0"] for n, r in results.items()},
        "held_bytes_2_over_1": round(two["held_bytes_rank0"] / one["held_bytes_rank0"], 3),
        "tokens_per_s": {n: round(r["tokens_per_s"], 1) for n, r in results.items()},
        "tokens_per_s_2_over_1": round(two["tokens_per_s"] / one["tokens_per_s"], 3),
        "tokens_per_s_each_round": {n: [round(x["tokens_per_s"], 1) for x in rs] for n, rs in rounds.items()},
        "tokens_per_s_2_over_1_each_round": [round(b["tokens_per_s"] / a["tokens_per_s"], 3)
                                             for a, b in zip(rounds[1], rounds[2])],
        "gather_publish_s": {n: round(r["gather_publish_s"], 3) for n, r in results.items()},
        "samples_per_step": args.samples, "tokens_per_sample": 16 + args.tokens, "steps": args.steps,
        "rounds": args.rounds,
    }))


if __name__ == "__main__":
    main()
