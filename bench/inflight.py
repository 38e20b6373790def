"""In-flight weight updates against drain-then-update, side by side: the same stream-async job,
prompts and seeds with `pipeline.inFlightUpdates` false (a version that arrives while requests
run waits until they finish, admission held meanwhile) and true (it loads at once; the running
requests go on with it, their samples mixing versions). Output lengths are long-tailed (the
built-in model warm-started for `--warm-start-steps` really counts long spans), which is what
makes a drain costly: the few long requests hold the new version back while the batch empties.
Runs alternate in `--rounds` rounds, the order swapped each round (drift on shared cores is
as large as the effect). Prints a table and, as the last line, a JSON object with samples/s of
each, their ratio, the generator's bubble seconds (idle, plus decoding at low occupancy), the
trainer's pipeline bubble, mean/max staleness and how many samples mixed versions.

    python bench/inflight.py [--iterations 20] [--prompts-per-step 32] [--rounds 2] [--engine torch|vllm]
                             [--warm-start-steps 4000] [--out runs/bench-inflight]

Each invocation runs in a new directory under --out (bench/provenance.py), one run directory
<config>-r<round> per run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import OUT_HELP, Invocation  # noqa: E402
from streamrl.metrics import LOW_OCCUPANCY  # noqa: E402
from streamrl.records import METRICS_FILE, SUMMARY_FILE, IterationRecord, RunSummary  # noqa: E402
from streamrl.timeline import read_spans  # noqa: E402

CONFIGS = {"drain": False, "in-flight": True}
"""Config name -> pipeline.inFlightUpdates."""
VLLM_ENGINE = {"type": "vllm", "device": "cpu", "enforceEager": True, "maxNumSeqs": 64}


@dataclass(frozen=True)
class RunFigures:
    """One run, over its training window (the first iteration's start to the last one's end)."""

    samples_per_s: float
    generator_idle_s: float
    """The generator's idle seconds (waiting for work or weights)."""
    generator_low_occupancy_s: float
    """Its seconds decoding below lowOccupancy of its batch with nothing that could join (a
    drain's tail included)."""
    window_s: float
    staleness_mean: float
    """Sample-weighted over the iterations."""
    staleness_max: int
    num_samples: int
    num_samples_mixed_versions: int
    versions_per_sample_mean: float
    pipeline_bubble_ratio: float
    """The trainer's share of the run waiting for samples (summary.json)."""
    reward_mean: float

    @property
    def generator_bubble_s(self) -> float:
        return self.generator_idle_s + self.generator_low_occupancy_s


def job_for(name: str, args) -> dict:
    job = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    job["metadata"]["name"] = f"inflight-{name}"
    spec = job["spec"]
    spec["model"]["warmStartSteps"] = args.warm_start_steps
    # A small learning rate keeps the length distribution still: both configs face one workload.
    spec["algorithm"].update(numIterations=args.iterations, promptsPerStep=args.prompts_per_step,
                             learningRate=args.learning_rate)
    spec["pipeline"] = {"mode": "stream-async", "inFlightUpdates": CONFIGS[name]}
    if args.engine == "vllm":
        spec["generators"]["pools"][0]["engine"] = dict(VLLM_ENGINE)
    return job


def _overlap(span: dict, start: float, end: float) -> float:
    return max(0.0, min(span["end"], end) - max(span["start"], start))


def figures(run_dir: Path) -> RunFigures:
    records = IterationRecord.read_lines(run_dir / METRICS_FILE)
    summary = RunSummary.read(run_dir / SUMMARY_FILE)
    start = records[0].time_unix - records[0].wall_s
    end = records[-1].time_unix
    idle = low = 0.0
    for path in sorted((run_dir / "timeline").glob("generator*.jsonl")):
        for span in read_spans(path):
            if span["state"] == "idle":
                idle += _overlap(span, start, end)
            elif span["reason"] == LOW_OCCUPANCY:
                low += _overlap(span, start, end)
    n = sum(r.num_samples for r in records)
    return RunFigures(
        samples_per_s=summary.samples_per_s, generator_idle_s=idle, generator_low_occupancy_s=low,
        window_s=end - start, staleness_mean=sum(r.staleness_mean * r.num_samples for r in records) / n,
        staleness_max=max(r.staleness_max for r in records), num_samples=n,
        num_samples_mixed_versions=sum(r.num_samples_mixed_versions for r in records),
        versions_per_sample_mean=sum(r.versions_per_sample_mean * r.num_samples for r in records) / n,
        pipeline_bubble_ratio=summary.pipeline_bubble_ratio, reward_mean=summary.reward_mean)


def run(name: str, rnd: int, args, inv: Invocation) -> RunFigures:
    job_file = inv.dir / f"{name}.yaml"
    job_file.write_text(yaml.safe_dump(job_for(name, args)))
    run_dir = inv.run_dir(f"{name}-r{rnd}")
    subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job_file), "--out", str(run_dir), "--quiet"],
                   check=True)
    return figures(run_dir)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--prompts-per-step", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--engine", choices=["torch", "vllm"], default="torch")
    p.add_argument("--warm-start-steps", type=int, default=4000,
                   help="the built-in model's warm start (4000: the long tail of bench/skew.py, cached once made)")
    p.add_argument("--learning-rate", type=float, default=1e-6)
    p.add_argument("--out", default="runs/bench-inflight", help=OUT_HELP)
    args = p.parse_args()
    inv = Invocation(args.out)
    runs: dict[str, list[RunFigures]] = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    for rnd in range(args.rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            f = run(name, rnd, args, inv)
            runs[name].append(f)
            print(f"round {rnd}: {name} {f.samples_per_s:.1f} samples/s, generator bubble {f.generator_bubble_s:.2f}s",
                  flush=True)

    def mean(name: str, key: str) -> float:
        return _mean([getattr(f, key) for f in runs[name]])

    table = {name: {
        "samples_per_s": mean(name, "samples_per_s"),
        "generator_bubble_s": mean(name, "generator_bubble_s"),
        "generator_idle_s": mean(name, "generator_idle_s"),
        "generator_low_occupancy_s": mean(name, "generator_low_occupancy_s"),
        "window_s": mean(name, "window_s"),
        "staleness_mean": mean(name, "staleness_mean"),
        "staleness_max": max(f.staleness_max for f in runs[name]),
        "mixed_versions_share": sum(f.num_samples_mixed_versions for f in runs[name])
        / sum(f.num_samples for f in runs[name]),
        "versions_per_sample_mean": mean(name, "versions_per_sample_mean"),
        "pipeline_bubble_ratio": mean(name, "pipeline_bubble_ratio"),
        "reward_mean": mean(name, "reward_mean"),
    } for name in CONFIGS}
    print(f"{'config':<10} {'samples/s':>10} {'gen bubble s':>13} {'idle s':>8} {'low occ s':>10} {'window s':>9} "
          f"{'stale mean':>11} {'stale max':>10} {'mixed':>7} {'pipe bubble':>12}  samples/s per run")
    for name, t in table.items():
        print(f"{name:<10} {t['samples_per_s']:>10.1f} {t['generator_bubble_s']:>13.2f} {t['generator_idle_s']:>8.2f} "
              f"{t['generator_low_occupancy_s']:>10.2f} {t['window_s']:>9.1f} {t['staleness_mean']:>11.3f} "
              f"{t['staleness_max']:>10d} {t['mixed_versions_share']:>7.1%} {t['pipeline_bubble_ratio']:>12.2f}  "
              f"{' '.join(f'{f.samples_per_s:.1f}' for f in runs[name])}")
    ratio = table["in-flight"]["samples_per_s"] / table["drain"]["samples_per_s"]
    print(f"in-flight / drain samples/s: {ratio:.3f}")
    print(inv.report({
        "samples_per_s": {k: round(t["samples_per_s"], 2) for k, t in table.items()},
        "in_flight_over_drain": round(ratio, 3),
        "samples_per_s_per_run": {k: [round(f.samples_per_s, 2) for f in v] for k, v in runs.items()},
        "generator_bubble_s": {k: round(t["generator_bubble_s"], 3) for k, t in table.items()},
        "generator_idle_s": {k: round(t["generator_idle_s"], 3) for k, t in table.items()},
        "generator_low_occupancy_s": {k: round(t["generator_low_occupancy_s"], 3) for k, t in table.items()},
        "window_s": {k: round(t["window_s"], 2) for k, t in table.items()},
        "staleness_mean": {k: round(t["staleness_mean"], 4) for k, t in table.items()},
        "staleness_max": {k: t["staleness_max"] for k, t in table.items()},
        "mixed_versions_share": {k: round(t["mixed_versions_share"], 4) for k, t in table.items()},
        "versions_per_sample_mean": {k: round(t["versions_per_sample_mean"], 4) for k, t in table.items()},
        "pipeline_bubble_ratio": {k: round(t["pipeline_bubble_ratio"], 3) for k, t in table.items()},
        "reward_mean": {k: round(t["reward_mean"], 4) for k, t in table.items()},
        "engine": args.engine,
        "iterations": args.iterations,
        "prompts_per_step": args.prompts_per_step,
        "rounds": args.rounds,
        "warm_start_steps": args.warm_start_steps,
    }))


if __name__ == "__main__":
    main()
