"""Elastic generators side by side: the same growing-length workload (a length curriculum
on `counting-ramp`: output lengths ramp up steadily over the run), same seed, with the
generators fixed at the minimum, fixed at the maximum, and elastic (autoscaling.mode
Internal between the two). Reports samples/s, generator replica-seconds and the trainer's
pipeline-bubble ratio over the last third of the run; the last line is a JSON object.

Targets, in every round (each config measured in the same round): elastic keeps that
bubble <= 10%, reaches >= 0.9x the samples/s of fixed-at-maximum with fewer
replica-seconds, and reverses none of its scaling decisions. Each replica's time to join
(process start to first accepted sample) is reported too.

    python bench/elastic.py [--iterations 40] [--max-replicas 2] [--rounds 3] [--out runs/bench-elastic]

Each replica is one single-threaded process; `--cores` (default: --max-replicas) is passed
to `streamrl run`, so on a machine with fewer cores than replicas + trainer the processes
share cores and the maximum cannot be as fast as its replica count says. Every config runs
with its own Prometheus (`--prometheus`), so all carry the same monitoring load. Each
invocation runs in a new directory under --out (bench/provenance.py), one run directory
<config>-r<round> per run.
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
from streamrl.records import (  # noqa: E402
    LOCAL_RUN_FILE,
    METRICS_FILE,
    SCALING_FILE,
    SUMMARY_FILE,
    IterationRecord,
    LocalRun,
    RunSummary,
    ScalingRecord,
)
from streamrl.scaling.policy import count_reversals  # noqa: E402

CONFIGS = ("fixed-min", "fixed-max", "elastic")
REVERSAL_WINDOW_S = 30.0
"""A scaling change undone within this long is a flap (the rounds here are one second)."""


def job(config: str, args) -> dict:
    doc = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    doc["metadata"]["name"] = f"elastic-{config}"
    spec = doc["spec"]
    # A longer warm start: the model then stops where the answer does (a 600-step model runs
    # on past short answers), so output lengths really ramp with the curriculum.
    spec["model"]["warmStartSteps"] = args.warm_start_steps
    spec["task"] = {"name": "counting-ramp", "numPrompts": args.iterations * args.prompts_per_step,
                    "curriculum": True, "seed": args.seed}
    spec["algorithm"].update(numIterations=args.iterations, promptsPerStep=args.prompts_per_step, groupSize=8,
                             learningRate=1e-5, seed=args.seed)
    spec["pipeline"] = {"mode": "stream-async"}
    replicas = args.max_replicas if config == "fixed-max" else 1
    spec["generators"]["pools"] = [{"name": "default", "replicas": replicas, "minReplicas": 1,
                                    "maxReplicas": args.max_replicas,
                                    "engine": {"type": "torch", "maxBatchSize": args.batch}}]
    if config == "elastic":
        spec["autoscaling"] = {"mode": "Internal", "intervalSeconds": 1, "minUtilisation": args.min_utilisation,
                               "cooldownSeconds": 10, "behavior": {
                                   "scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 2}]},
                                   "scaleDown": {"stabilizationWindowSeconds": 5,
                                                 "policies": [{"type": "Pods", "value": 1, "periodSeconds": 5}]}}}
    return doc


def measure(run_dir: Path) -> dict:
    """The trainer's summary.json and metrics.jsonl, and the runner's run.json (replica-seconds, scaling)."""
    summary, local = RunSummary.read(run_dir / SUMMARY_FILE), LocalRun.read(run_dir / LOCAL_RUN_FILE)
    records = IterationRecord.read_lines(run_dir / METRICS_FILE)
    last = records[len(records) - len(records) // 3:]
    wall = sum(r.wall_s for r in last)
    out = {
        "samples_per_s": summary.samples_per_s,
        "replica_seconds": local.generator_replica_seconds,
        "bubble_last_third": sum(r.pipeline_bubble_ratio * r.wall_s for r in last) / wall,
        "bubble": summary.pipeline_bubble_ratio,
        "accepted": summary.num_samples_accepted,
        "join_s": [round(j.join_s, 2) for j in summary.generator_joins],
    }
    if local.autoscaling is not None:
        changes = [(r.time_unix, r.step) for r in ScalingRecord.read_lines(run_dir / SCALING_FILE) if r.step]
        out["scale_ups"] = local.autoscaling.scale_ups
        out["scale_downs"] = local.autoscaling.scale_downs
        out["reversals"] = count_reversals(changes, REVERSAL_WINDOW_S)
    return out


def targets(round_: dict[str, dict]) -> dict[str, bool]:
    """The issue's targets, for one round (each config measured in the same round)."""
    e, top = round_["elastic"], round_["fixed-max"]
    return {"bubble_last_third_at_most_0.10": e["bubble_last_third"] <= 0.10,
            "samples_per_s_at_least_0.9x_fixed_max": e["samples_per_s"] >= 0.9 * top["samples_per_s"],
            "fewer_replica_seconds_than_fixed_max": e["replica_seconds"] < top["replica_seconds"],
            "no_reversals": e["reversals"] == 0}


def ratio(round_: dict[str, dict], key: str) -> float:
    return round(round_["elastic"][key] / round_["fixed-max"][key], 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--max-replicas", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="engine batch cap per replica")
    p.add_argument("--min-utilisation", type=float, default=0.5, help="elastic: autoscaling.minUtilisation")
    p.add_argument("--cores", type=int, help="passed to streamrl run (default: --max-replicas)")
    p.add_argument("--rounds", type=int, default=3, help="each config runs once per round, in a rotated order")
    p.add_argument("--warm-start-steps", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/bench-elastic", help=OUT_HELP)
    args = p.parse_args()
    inv = Invocation(args.out)
    rounds: list[dict[str, dict]] = []
    for r in range(args.rounds):
        rounds.append({})
        for config in CONFIGS[r % 3:] + CONFIGS[:r % 3]:
            job_file = inv.dir / f"{config}.yaml"
            job_file.write_text(yaml.safe_dump(job(config, args)))
            run_dir = inv.run_dir(f"{config}-r{r}")
            print(f"round {r + 1}/{args.rounds}: {config}", file=sys.stderr, flush=True)
            # Every config runs with its Prometheus (elastic needs it; the others get the same load).
            subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job_file), "--out", str(run_dir),
                            "--quiet", "--prometheus", "--cores", str(args.cores or args.max_replicas)], check=True)
            rounds[r][config] = measure(run_dir)
    numeric = ("samples_per_s", "replica_seconds", "bubble", "bubble_last_third")
    mean = {c: {k: sum(rd[c][k] for rd in rounds) / len(rounds) for k in numeric} for c in CONFIGS}
    expected = args.iterations * args.prompts_per_step * 8
    print(f"{'round':<6} {'config':<10} {'samples/s':>10} {'replica-s':>10} {'bubble':>8} {'last third':>11} "
          f"{'joins (s)':>18} {'reversals':>9}")
    for r, rd in enumerate(rounds):
        for c, m in rd.items():
            print(f"{r + 1:<6} {c:<10} {m['samples_per_s']:>10.1f} {m['replica_seconds']:>10.1f} {m['bubble']:>8.3f} "
                  f"{m['bubble_last_third']:>11.3f} {' '.join(f'{j:.1f}' for j in m['join_s']):>18} "
                  f"{m.get('reversals', ''):>9}")
    for c, m in mean.items():
        print(f"{'mean':<6} {c:<10} {m['samples_per_s']:>10.1f} {m['replica_seconds']:>10.1f} {m['bubble']:>8.3f} "
              f"{m['bubble_last_third']:>11.3f}")
    checks = [targets(rd) for rd in rounds]
    # A replica added while the run was going (not one of the first at start-up) joins on busy cores.
    added = [j for rd in rounds for j in rd["elastic"]["join_s"][1:]]
    print(inv.report({
        "rounds": [{c: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in m.items()} for c, m in rd.items()}
                   for rd in rounds],
        "mean": {c: {k: round(v, 3) for k, v in m.items()} for c, m in mean.items()},
        "elastic_over_fixed_max_samples_per_s": [ratio(rd, "samples_per_s") for rd in rounds],
        "elastic_over_fixed_max_replica_seconds": [ratio(rd, "replica_seconds") for rd in rounds],
        "elastic_reversals": [rd["elastic"]["reversals"] for rd in rounds],
        "join_s_of_added_replicas": added,
        "join_s_mean_of_added_replicas": round(sum(added) / len(added), 2) if added else None,
        "targets_by_round": checks,
        "targets_met_every_round": all(all(c.values()) for c in checks),
        "every_sample_once": all(m["accepted"] == expected for rd in rounds for m in rd.values()),
        "iterations": args.iterations, "max_replicas": args.max_replicas, "cores": args.cores or args.max_replicas,
    }))


if __name__ == "__main__":
    main()
