"""Pipeline modes side by side: the same job, seed and total cores in colocated, batch,
stream-sync and stream-async. Prints a table and, as the last line, a JSON object with samples/s per mode,
ratios to colocated, reward per sample and each mode's pipeline-bubble ratio.

    python bench/modes.py [--iterations 20] [--prompts-per-step 64] [--modes MODE ...] [--out runs/bench-modes]

Each invocation runs in a new directory under --out (bench/provenance.py), one run directory per mode.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import OUT_HELP, Invocation  # noqa: E402
from streamrl.records import METRICS_FILE, SUMMARY_FILE, IterationRecord, RunSummary  # noqa: E402

MODES = ["colocated", "batch", "stream-sync", "stream-async"]


def job_for(mode: str, iterations: int, prompts_per_step: int) -> dict:
    job = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    job["metadata"]["name"] = f"bench-{mode}"
    algo = job["spec"]["algorithm"]
    algo.update(numIterations=iterations, promptsPerStep=prompts_per_step)
    job["spec"]["pipeline"] = {"mode": mode}
    return job


def run_mode(mode: str, args, inv: Invocation) -> dict:
    job_file = inv.dir / f"{mode}.yaml"
    job_file.write_text(yaml.safe_dump(job_for(mode, args.iterations, args.prompts_per_step)))
    run_dir = inv.run_dir(mode)
    subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job_file), "--out", str(run_dir), "--quiet"],
                   check=True)
    summary = RunSummary.read(run_dir / SUMMARY_FILE).model_dump()
    rewards = [r.reward_mean for r in IterationRecord.read_lines(run_dir / METRICS_FILE)]
    mean = sum(rewards) / len(rewards)
    var = sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)
    summary["reward_se"] = (var / len(rewards)) ** 0.5  # standard error over iterations
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--prompts-per-step", type=int, default=64)
    p.add_argument("--modes", nargs="+", choices=MODES, default=MODES, metavar="MODE",
                   help=f"the modes to run, of {', '.join(MODES)} (default: all); figures that compare a mode "
                        "left out are null")
    p.add_argument("--out", default="runs/bench-modes", help=OUT_HELP)
    args = p.parse_args()
    if args.iterations < 2:
        p.error("--iterations must be at least 2 (the reward's standard error needs two iterations)")
    inv = Invocation(args.out)
    results = {mode: run_mode(mode, args, inv) for mode in MODES if mode in args.modes}

    def over(a: str, b: str, digits: int = 3) -> float | None:
        """Samples/s of mode `a` over mode `b`; None when either was left out."""
        if a not in results or b not in results:
            return None
        return round(results[a]["samples_per_s"] / results[b]["samples_per_s"], digits)

    print(f"{'mode':<12} {'samples/s':>10} {'x colocated':>12} {'reward/sample':>14} {'bubble':>8}")
    for mode, s in results.items():
        x = over(mode, "colocated", 2)
        print(f"{mode:<12} {s['samples_per_s']:>10.1f} {'-' if x is None else f'{x:.2f}':>12} "
              f"{s['reward_mean']:>14.3f} {s['pipeline_bubble_ratio']:>8.2f}")
    # Noise: iteration rewards vary with the prompts drawn; two modes differ "beyond noise"
    # when their reward per sample differs by more than twice the combined standard error.
    a, c = results.get("stream-async"), results.get("colocated")
    noise = 2 * (a["reward_se"] ** 2 + c["reward_se"] ** 2) ** 0.5 if a and c else None
    if a and c:
        print(f"stream-async reward - colocated reward = {a['reward_mean'] - c['reward_mean']:+.4f}; "
              f"noise (2 x combined SE over iterations) = {noise:.4f}")
    print(inv.report({
        "samples_per_s": {m: round(s["samples_per_s"], 2) for m, s in results.items()},
        "ratio_to_colocated": {m: over(m, "colocated") for m in results},
        "stream_sync_over_batch": over("stream-sync", "batch"),
        "stream_async_over_colocated": over("stream-async", "colocated"),
        "reward_per_sample": {m: round(s["reward_mean"], 4) for m, s in results.items()},
        "pipeline_bubble_ratio": {m: round(s["pipeline_bubble_ratio"], 3) for m, s in results.items()},
        "reward_se": {m: round(s["reward_se"], 4) for m, s in results.items()},
        "async_reward_minus_colocated": round(a["reward_mean"] - c["reward_mean"], 4) if a and c else None,
        "reward_noise_2se": round(noise, 4) if noise is not None else None,
        "iterations": args.iterations,
        "prompts_per_step": args.prompts_per_step,
    }))


if __name__ == "__main__":
    main()
