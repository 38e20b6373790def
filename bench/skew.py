"""Skewness-aware generation side by side: the same long-tailed workload, prompts and seeds
on two generator replicas under `random-fifo`, `oracle` (true lengths of the random-fifo
run) and `skewness-aware` (the ranker; planner objective `sum`, then `max`), in `batch` mode so generation time is measured
alone. Prints a table and, as the last line, a JSON object with generation time per
iteration, the ratios, and the ranker's recall at top-20/10/5%.

    python bench/skew.py [--iterations 10] [--prompts-per-step 64] [--replicas 2]
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

from streamrl.ranker.predictor import setup_predictor  # noqa: E402
from streamrl.ranker.ranker import Ranker  # noqa: E402


def run(policy: str, args, out: Path, oracle: Path | None = None, objective: str = "sum") -> list[dict]:
    job = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny.yaml").read_text())
    job["metadata"]["name"] = f"skew-{policy}"
    spec = job["spec"]
    # A longer warm start: the model then really produces the task's long tail (a
    # 600-step model truncates long counts), and a tiny learning rate keeps the length
    # distribution still, so the policies face the same workload.
    spec["model"]["warmStartSteps"] = args.warm_start_steps
    spec["algorithm"].update(numIterations=args.iterations, promptsPerStep=args.prompts_per_step,
                             learningRate=1e-7)
    spec["pipeline"] = {"mode": "batch"}
    spec["trainer"] = {"minGenerators": args.replicas}
    spec["generators"]["pools"][0]["replicas"] = args.replicas
    spec["generators"]["dispatch"] = {"policy": policy, "objective": objective,
                                      **({"oracleLengths": str(oracle)} if oracle else {})}
    name = policy if objective == "sum" else f"{policy}-{objective}"
    job_file = out / f"{name}.yaml"
    job_file.write_text(yaml.safe_dump(job))
    subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job_file), "--out", str(out / name),
                    "--quiet"], check=True)
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--prompts-per-step", type=int, default=64)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--warm-start-steps", type=int, default=1500)
    p.add_argument("--out", default="runs/bench-skew")
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = {"random-fifo": run("random-fifo", args, out)}
    results["oracle"] = run("oracle", args, out, oracle=out / "random-fifo" / "lengths.jsonl")
    results["skewness-aware"] = run("skewness-aware", args, out)
    results["skewness-aware-max"] = run("skewness-aware", args, out, objective="max")
    lengths = np.array([json.loads(line)["mean_length"]
                        for line in (out / "random-fifo" / "lengths.jsonl").read_text().splitlines()])
    # Iteration 0 runs before the ranker has seen anything: it is reported but not averaged.
    gen = {k: float(np.mean([r["generation_s"] for r in rs[1:]])) for k, rs in results.items()}
    ranker = Ranker(setup_predictor("features"), out / "skewness-aware" / "ranker.npz")
    recall = ranker.recall()
    print(f"{'policy':<16} {'generation s/iteration':>23} {'x random-fifo':>14}")
    for k, v in gen.items():
        print(f"{k:<16} {v:>23.3f} {v / gen['random-fifo']:>14.2f}")
    print(f"ranker recall top-20/10/5%: {recall[0.2]:.2f} / {recall[0.1]:.2f} / {recall[0.05]:.2f}; "
          f"workload p99/p50 of mean output length per prompt: "
          f"{np.percentile(lengths, 99) / np.percentile(lengths, 50):.1f}")
    print(json.dumps({
        "generation_s_per_iteration": {k: round(v, 4) for k, v in gen.items()},
        "skewness_aware_over_random_fifo": round(gen["skewness-aware"] / gen["random-fifo"], 3),
        "skewness_aware_over_oracle": round(gen["skewness-aware"] / gen["oracle"], 3),
        "objective_max_over_sum": round(gen["skewness-aware-max"] / gen["skewness-aware"], 3),
        "ranker_recall": {f"top{int(k * 100)}": round(v, 3) for k, v in recall.items()},
        "length_p99_over_p50": round(float(np.percentile(lengths, 99) / np.percentile(lengths, 50)), 2),
        "replicas": args.replicas, "iterations": args.iterations, "prompts_per_step": args.prompts_per_step,
    }))


if __name__ == "__main__":
    main()
