"""Skewness-aware generation side by side: the same long-tailed workload, prompts and seeds
on two generator replicas under `random-fifo`, `oracle` (true lengths of the random-fifo
run) and `skewness-aware` (the ranker; planner objective `sum`, then `max`), in `batch`
mode so generation time is measured alone. `random-fifo-late` is random-fifo with the
ranked policies' late binding (queueFactor 1.25): it splits the gain into what binding
work late gives and what the predicted order adds. Run-to-run drift on shared cores is as
large as the effect, so the policies run in `--rounds` rounds, each in a rotated order, and
each policy's figure is the mean over its runs. Prints a table and, as the last line, a
JSON object with generation time per iteration, the ratios, each policy's skewness-bubble
share (replica time decoding below lowOccupancy with nothing waiting: the most any
dispatch could win back), the ranker's recall at top-20/10/5% and the workload's p99/p50
of output length.

The built-in model is warm-started for `--warm-start-steps` (4000: about 10 minutes on one
core the first time, cached after) so that it really counts long spans: output length
then follows the prompt, as in RL on real tasks, instead of coming from sampling slips.

    python bench/skew.py [--iterations 10] [--rounds 2] [--prompts-per-step 64] [--replicas 2] [--out runs/bench-skew]

Each invocation runs in a new directory under --out (bench/provenance.py), one run directory
<policy>-r<round> per run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import OUT_HELP, Invocation  # noqa: E402
from streamrl.ranker.predictor import setup_predictor  # noqa: E402
from streamrl.ranker.ranker import Ranker  # noqa: E402
from streamrl.records import METRICS_FILE, IterationRecord  # noqa: E402

CONFIGS = {  # name -> (policy, dispatch settings)
    "random-fifo": ("random-fifo", {}),
    "oracle": ("oracle", {}),
    "skewness-aware": ("skewness-aware", {"objective": "sum"}),
    "skewness-aware-max": ("skewness-aware", {"objective": "max"}),
    "random-fifo-late": ("random-fifo", {"queueFactor": 1.25}),
}


def run(name: str, args, inv: Invocation, oracle: Path) -> list[IterationRecord]:
    job = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    job["metadata"]["name"] = f"skew-{name}"
    spec = job["spec"]
    # A long warm start: the model then really produces the task's long tail (600 or
    # 1500 steps truncate long counts), and a tiny learning rate keeps the length
    # distribution still, so the policies face the same workload.
    spec["model"]["warmStartSteps"] = args.warm_start_steps
    spec["algorithm"].update(numIterations=args.iterations, promptsPerStep=args.prompts_per_step,
                             learningRate=1e-7)
    spec["pipeline"] = {"mode": "batch"}
    spec["trainer"] = {"minGenerators": args.replicas}
    spec["generators"]["pools"][0]["replicas"] = args.replicas
    policy, settings = CONFIGS[name]
    spec["generators"]["dispatch"] = {"policy": policy, **settings,
                                      **({"oracleLengths": str(oracle)} if policy == "oracle" else {})}
    job_file = inv.dir / f"{name}.yaml"
    job_file.write_text(yaml.safe_dump(job))
    run_dir = inv.run_dir(f"{name}-r{args.round}")
    subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job_file), "--out", str(run_dir),
                    "--quiet"], check=True)
    return IterationRecord.read_lines(run_dir / METRICS_FILE)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prompts-per-step", type=int, default=64)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--warm-start-steps", type=int, default=4000)
    p.add_argument("--out", default="runs/bench-skew", help=OUT_HELP)
    args = p.parse_args()
    inv = Invocation(args.out)
    # random-fifo first (the oracle reads its lengths), then each round in a rotated order.
    names = list(CONFIGS)
    oracle = inv.dir / "random-fifo-r0" / "lengths.jsonl"
    runs: dict[str, list[float]] = {}
    bubble: dict[str, list[float]] = {}  # skewness-bubble replica-seconds per iteration
    for rnd in range(args.rounds):
        args.round = rnd
        k = rnd % len(names)
        for name in names[k:] + names[:k]:
            records = run(name, args, inv, oracle)
            # Iteration 0 runs before the ranker has seen anything: it is not averaged.
            runs.setdefault(name, []).append(float(np.mean([r.generation_s for r in records[1:]])))
            bubble.setdefault(name, []).append(float(np.mean(
                [r.skewness_bubble_ratio * args.replicas * r.wall_s for r in records[1:]])))
            print(f"round {args.round}: {name} {runs[name][-1]:.3f} s/iteration", flush=True)
    gen = {k: float(np.mean(v)) for k, v in runs.items()}
    # The share of replica time spent decoding below lowOccupancy with nothing waiting: the
    # skewness bubble. Only time inside it can be won back by any dispatch or ordering.
    bubble_share = {k: float(np.mean(v)) / (args.replicas * gen[k]) for k, v in bubble.items()}
    lengths = np.array([n for line in oracle.read_text().splitlines() for n in json.loads(line)["lengths"]])
    ranker = Ranker(setup_predictor("features"), inv.dir / f"skewness-aware-r{args.rounds - 1}" / "ranker.npz")
    recall = ranker.recall()
    print(f"{'policy':<20} {'generation s/iteration':>23} {'x random-fifo':>14} {'skewness bubble':>16}  runs")
    for k, v in gen.items():
        print(f"{k:<20} {v:>23.3f} {v / gen['random-fifo']:>14.2f} {bubble_share[k]:>16.1%}  "
              f"{' '.join(f'{x:.3f}' for x in runs[k])}")
    print(f"ranker recall top-20/10/5%: {recall[0.2]:.2f} / {recall[0.1]:.2f} / {recall[0.05]:.2f}; "
          f"workload p99/p50 of output length: "
          f"{np.percentile(lengths, 99) / np.percentile(lengths, 50):.1f}")
    print(inv.report({
        "generation_s_per_iteration": {k: round(v, 4) for k, v in gen.items()},
        "generation_s_per_run": {k: [round(x, 4) for x in v] for k, v in runs.items()},
        "skewness_aware_over_random_fifo": round(gen["skewness-aware"] / gen["random-fifo"], 3),
        "skewness_aware_over_oracle": round(gen["skewness-aware"] / gen["oracle"], 3),
        "objective_max_over_sum": round(gen["skewness-aware-max"] / gen["skewness-aware"], 3),
        "random_fifo_late_over_random_fifo": round(gen["random-fifo-late"] / gen["random-fifo"], 3),
        "skewness_aware_over_random_fifo_late": round(gen["skewness-aware"] / gen["random-fifo-late"], 3),
        "skewness_bubble_share": {k: round(v, 3) for k, v in bubble_share.items()},
        "ranker_recall": {f"top{int(k * 100)}": round(v, 3) for k, v in recall.items()},
        "length_p99_over_p50": round(float(np.percentile(lengths, 99) / np.percentile(lengths, 50)), 2),
        "replicas": args.replicas, "iterations": args.iterations, "rounds": args.rounds,
        "prompts_per_step": args.prompts_per_step, "warm_start_steps": args.warm_start_steps,
    }))


if __name__ == "__main__":
    main()
