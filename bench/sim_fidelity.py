"""The simulator against the real thing, side by side in one go. `streamrl profile` measures the
job's model on this machine right before and right after each real run (each mode of
bench/modes.py in a run of its own, and bench/skew.py): for colocated mode's one process, one
profile with every core; for the disaggregated modes, two at once, each pinned to one thread on
the core the run gives a stage (`streamrl run` hands the trainer the first core and the
generator replica the next), the trainer's costs taken from its core's profile and the
replica's from its own. This machine's cores drift in speed apart from each other, by up to
1.5x for tens of seconds: a profile of one core, taken alone, predicts a run that needs both.
The simulator, fed only with those profiles (their seconds, and the machine's cores the local
run shares out) and each run's own output lengths and ranker predictions (the workload and the
ranker's quality, not a time), predicts each run from the profiles before it and from those
after it, and takes the harmonic mean of the two samples/s (the mean of the two run times: a
run at one speed for a while and another for the rest takes the mean time, not the mean rate):

- samples/s and pipeline-bubble ratio per mode (targets: within 15% and 0.05), judged on the
  means over --repeats runs of each mode (each repeat's figures are printed beside them), and
  beside them each stage's busy seconds in the run over the simulation's (from the run's
  timelines: which stage's work the profiles priced wrong when a ratio misses);
- the order of the dispatch policies by generation time, over every pair and over the pairs
  the measured rounds separate (means apart by more than twice their combined standard
  error; the rest are ties within noise);
- the memory-bound regime this machine cannot run: an H20-class analytic profile, 64
  replicas, outputs with p99/p50 >= 8, skewness-aware and oracle generation time relative
  to random-fifo.

Prints tables and, as the last line, a JSON object with predicted and measured figures and
their ratios.

    python bench/sim_fidelity.py [--iterations 20] [--prompts-per-step 64] [--repeats 2] [--skew-rounds 3]
                                 [--skip-skew] [--drawn-predictions] [--profile-steps 16]
                                 [--out runs/bench-sim-fidelity]

Each invocation writes into a new directory under --out (bench/provenance.py): the profiles, the
benches' logs, and each bench run's own invocation directory (repeat-<n>/<mode>/modes/...,
skew/...);
its provenance lists the run directories of every bench it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import OUT_HELP, Invocation, Provenance  # noqa: E402
from streamrl.local.launch import CorePlanner  # noqa: E402
from streamrl.local.plan import available_cores  # noqa: E402
from streamrl.planning.profile_record import load_profile  # noqa: E402
from streamrl.simulation.scenario import parse_scenario  # noqa: E402
from streamrl.simulation.simulator import simulate  # noqa: E402
from streamrl.tasks import counting_prompts  # noqa: E402
from streamrl.timeline import read_spans  # noqa: E402

JOB = ROOT / "deploy/examples/rljob-tiny-cpu.yaml"
MODES = ["colocated", "batch", "stream-sync", "stream-async"]
SKEW = {  # bench/skew.py's configurations: (policy, dispatch settings)
    "random-fifo": ("random-fifo", {}),
    "oracle": ("oracle", {}),
    "skewness-aware": ("skewness-aware", {"objective": "sum"}),
    "skewness-aware-max": ("skewness-aware", {"objective": "max"}),
    "random-fifo-late": ("random-fifo", {"queueFactor": 1.25}),
}


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def bench(argv: list[str], log: Path, inv: Invocation) -> tuple[dict, Provenance]:
    """A bench run in its own process: its last JSON line, and its provenance (whose run
    directories count as measured by this invocation too)."""
    report = last_json(run([sys.executable, *argv], log))
    provenance = Provenance.from_json(report["provenance"])
    inv.measured(provenance)
    return report, provenance


def run(argv: list[str], log: Path) -> str:
    """A bench or command in its own process; its output goes to `log` and is returned."""
    print("$", " ".join(argv), flush=True)
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}); see {log}:\n{proc.stderr[-2000:]}")
    return proc.stdout


@dataclass(frozen=True)
class Measured:
    """The profiles a run is simulated from: its trainer's and its generator replicas' (the
    same file where the run is one process on every core)."""

    trainer: Path
    generator: Path


class Profiler:
    """`streamrl profile` runs on this machine, each into a directory of its own under `out`,
    every one kept in the order taken. `cores`: the trainer's core and the generator replica's,
    as `streamrl run` hands them out (streamrl.local.launch.CorePlanner: the trainer first)."""

    def __init__(self, out: Path, prompt_tokens: int, completion_tokens: int, steps: int):
        self.out, self.prompt_tokens, self.completion_tokens, self.steps = out, prompt_tokens, completion_tokens, steps
        planner = CorePlanner()
        self.cores = {"trainer": planner.take(1), "generator": planner.take(1)}
        self.taken: list[dict] = []
        """{threads, core (None: unpinned), path, group}, in the order measured; a pair measured
        together shares its group."""
        self._last: tuple[bool, Measured] | None = None
        """The kind (per_core) and profiles of the last measurement."""

    def measure(self, per_core: bool) -> Measured:
        """Fresh profiles: one thread on each stage's core, both at once (`per_core`), else one
        profile with every core."""
        group = len({t["group"] for t in self.taken})
        where = self.out / f"profile-{group:02d}"
        where.mkdir(parents=True, exist_ok=True)
        if not per_core:
            threads = max(1, len(available_cores()))
            path = where / f"profile-{threads}-thread.json"
            run_together([(self._argv(path, threads), where / f"profile-{threads}.log", [])])
            self.taken.append({"threads": threads, "core": None, "path": str(path), "group": group})
            self._last = False, Measured(path, path)
            return self._last[1]
        paths = {stage: where / f"profile-1-thread-{stage}.json" for stage in self.cores}
        run_together([(self._argv(paths[stage], 1), where / f"profile-1-{stage}.log", cores)
                      for stage, cores in self.cores.items()])
        for stage, cores in self.cores.items():
            self.taken.append({"threads": 1, "core": cores[0] if cores else None, "path": str(paths[stage]),
                               "group": group})
        self._last = True, Measured(paths["trainer"], paths["generator"])
        return self._last[1]

    def latest(self, per_core: bool) -> Measured:
        """The profiles of that kind measured last, if they were the last thing measured at all
        (nothing ran since); else fresh ones."""
        if self._last is not None and self._last[0] == per_core:
            return self._last[1]
        return self.measure(per_core)

    def _argv(self, path: Path, threads: int) -> list[str]:
        return [sys.executable, "-m", "streamrl.cli", "profile", str(JOB), "--out", str(path), "--threads",
                str(threads), "--prompt-tokens", str(self.prompt_tokens), "--completion-tokens",
                str(self.completion_tokens), "--steps", str(self.steps)]


def run_together(commands: list[tuple[list[str], Path, list[int]]]) -> None:
    """Commands started at once, each pinned to its cores (none: unpinned) with its output in
    its log; returns once all have finished, SystemExit naming the first that failed."""
    procs = []
    for argv, log, cores in commands:
        print("$", *(["taskset", "-c", ",".join(map(str, cores))] if cores else []), " ".join(argv), flush=True)
        with open(log, "w") as out:
            procs.append((argv, log, subprocess.Popen(
                argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=(lambda c=cores: os.sched_setaffinity(0, c)) if cores else None)))
    codes = [(argv, log, proc.wait()) for argv, log, proc in procs]
    for argv, log, code in codes:
        if code:
            raise SystemExit(f"{' '.join(argv)} failed ({code}); see {log}:\n{log.read_text()[-2000:]}")


def scenario(name: str, mode: str, lengths: Path, profiles: Measured, prompt_tokens: int, job: dict,
             replicas: int = 1, dispatch: dict | None = None, ranker_log_error: float = 0.5) -> dict:
    """The job as a scenario: its batch shape and engine, this machine's profiles (the trainer's
    and the replicas'), a run's lengths."""
    algo, spec, cores = job["spec"]["algorithm"], job["spec"], len(available_cores())
    # float32 weights, as the built-in model publishes them
    size = load_profile(profiles.generator).model.num_params * 4
    return {
        "name": name, "pipeline": {"mode": mode},
        "algorithm": {"numIterations": algo["numIterations"], "promptsPerStep": algo["promptsPerStep"],
                      "groupSize": algo["groupSize"], "microBatchSize": algo["microBatchSize"]},
        "workload": {"promptTokens": prompt_tokens, "maxNewTokens": algo["maxNewTokens"],
                     "lengths": {"type": "replay", "path": str(lengths)}, "rankerLogError": ranker_log_error},
        "dispatch": dispatch or {"policy": "random-fifo"},
        "trainer": {"gpus": 1, "cost": {"type": "profile", "path": str(profiles.trainer)}},
        "generators": [{"name": "default", "replicas": replicas,
                        "cost": {"type": "profile", "path": str(profiles.generator)},
                        "maxBatchSize": spec["generators"]["pools"][0]["engine"]["maxBatchSize"]}],
        # loopback: FetchWeights' measured 505 MB/s (README, bench/weights.py)
        "network": {"local": {"bandwidthGbps": 4.0, "latencyMs": 0.1}},
        "weights": {"sizeBytes": size},
        # streamrl run shares this machine's cores out (colocated: one process on all of them)
        **({} if mode == "colocated" or not cores else {"placement": {"cores": cores}}),
    }


STAGES = ("trainer", "generators")
"""The stages whose busy seconds are compared: the trainer's process (rank 0) and every replica together."""


def simulate_mode(args, mode: str, run_dir: Path, bracket: tuple[Measured, Measured], prompt_tokens: int) -> dict:
    """One real run of `mode` (its directory `run_dir`) simulated from each of `bracket` (the
    profiles taken right before and right after it) and the run's own output lengths:
    {samples_per_s (the harmonic mean of the two: the mean of their run times),
    pipeline_bubble_ratio (the mean), busy_s (each stage's busy seconds, the mean)}."""
    job = yaml.safe_load(JOB.read_text())
    job["spec"]["algorithm"].update(numIterations=args.iterations, promptsPerStep=args.prompts_per_step)
    runs = [simulate(parse_scenario(scenario(f"modes-{mode}", mode, run_dir / "lengths.jsonl", profiles,
                                             prompt_tokens, job))).summary for profiles in bracket]
    busy = [{"trainer": sum(s.utilisation * s.gpu_seconds for s in r.stages if s.name == "trainer"),
             "generators": sum(s.utilisation * s.gpu_seconds for s in r.stages if s.name != "trainer")} for r in runs]
    return {"samples_per_s": statistics.harmonic_mean([r.samples_per_s for r in runs]),
            "pipeline_bubble_ratio": statistics.mean(r.pipeline_bubble_ratio for r in runs),
            "busy_s": {stage: statistics.mean(b[stage] for b in busy) for stage in STAGES}}


def measured_busy_s(run_dir: Path) -> dict[str, float]:
    """Each stage's busy seconds in a real run, from its timeline (streamrl.timeline): where the
    time went that the samples/s ratio sums up (a stage running 1.2x its simulated busy time
    ran its work slower than its profile priced it)."""
    def busy(paths) -> float:
        return sum(s["end"] - s["start"] for path in paths for s in read_spans(path) if s["state"] == "busy")

    return {"trainer": busy([run_dir / "timeline" / "trainer.jsonl"]),
            "generators": busy(sorted((run_dir / "timeline").glob("generator-*.jsonl")))}


def modes_side_by_side(args, inv: Invocation, profiler: Profiler) -> dict:
    """`--repeats` rounds of bench/modes.py, one mode per run, each run bracketed by profiles
    of its own (one thread on each stage's core, both at once, for the disaggregated modes;
    every core for colocated mode's one process), measured right before and right after it,
    and simulated from each. This machine's speed drifts by tens of percent between minutes
    (PTL(64) of back-to-back profiles has read 2.85 and 4.55 ms), each core apart from the
    other, and a profile takes seconds where a run takes half a minute: the profiles around a
    run see the machine it ran on far better than profiles taken minutes away. The targets are
    judged on the means over repeats (each repeat's ratio is reported beside them)."""
    out = inv.dir
    prompt_tokens = profiler.prompt_tokens
    repeats: list[dict[str, dict]] = []
    for r in range(args.repeats):
        rows: dict[str, dict] = {}
        for mode in MODES:
            per_core = mode != "colocated"
            before = profiler.latest(per_core)
            where = out / f"repeat-{r}" / mode
            where.mkdir(parents=True, exist_ok=True)
            measured, runs_of = bench(["bench/modes.py", "--iterations", str(args.iterations), "--prompts-per-step",
                                       str(args.prompts_per_step), "--modes", mode, "--out", str(where / "modes")],
                                      where / "modes.log", inv)
            after = profiler.measure(per_core)
            rows[mode] = {"predicted": simulate_mode(args, mode, runs_of.run_dir(mode), (before, after),
                                                     prompt_tokens),
                          "measured_busy_s": measured_busy_s(runs_of.run_dir(mode)),
                          "measured_samples_per_s": measured["samples_per_s"][mode],
                          "measured_bubble": measured["pipeline_bubble_ratio"][mode],
                          "ptl64_ms": [round(dict(load_profile(m.generator).ptl)[64] * 1e3, 2)
                                       for m in (before, after)],
                          "train_us_per_token": [round(load_profile(m.trainer).forward_backward_s_per_token * 1e6, 1)
                                                 for m in (before, after)]}
        repeats.append(rows)
    rows = {}
    for mode in MODES:
        sim = [rep[mode]["predicted"]["samples_per_s"] for rep in repeats]
        real = [rep[mode]["measured_samples_per_s"] for rep in repeats]
        sim_b = [rep[mode]["predicted"]["pipeline_bubble_ratio"] for rep in repeats]
        real_b = [rep[mode]["measured_bubble"] for rep in repeats]
        rows[mode] = {
            "samples_per_s": {"predicted": round(statistics.mean(sim), 2), "measured": round(statistics.mean(real), 2),
                              "ratio": round(statistics.mean(sim) / statistics.mean(real), 3),
                              "ratio_per_repeat": [round(p / m, 3) for p, m in zip(sim, real)],
                              "measured_per_repeat": real},
            "pipeline_bubble_ratio": {"predicted": round(statistics.mean(sim_b), 3),
                                      "measured": round(statistics.mean(real_b), 3),
                                      "difference": round(statistics.mean(sim_b) - statistics.mean(real_b), 3),
                                      "difference_per_repeat": [round(p - m, 3) for p, m in zip(sim_b, real_b)]},
            # colocated mode's one process does both stages' work on every core: no stage of its own to compare
            "stage_busy_s": None if mode == "colocated" else stage_busy([rep[mode] for rep in repeats]),
            "ptl64_ms_per_repeat": [rep[mode]["ptl64_ms"] for rep in repeats],
            "train_us_per_token_per_repeat": [rep[mode]["train_us_per_token"] for rep in repeats],
        }
    print(f"means over {args.repeats} repeat(s); busy real/sim: each stage's busy seconds in the run over the "
          "simulation's (T the trainer, G the replicas); per repeat: samples/s ratio, bubble difference, PTL(64) ms "
          "of the replica's profiles before and after, the trainer's forward/backward us per token before and after")
    print(f"{'mode':<13} {'samples/s sim':>14} {'real':>8} {'ratio':>7} {'bubble sim':>11} {'real':>6} {'diff':>6}"
          f"  {'busy real/sim':>15}  per repeat")
    for mode, r in rows.items():
        s, b, busy = r["samples_per_s"], r["pipeline_bubble_ratio"], r["stage_busy_s"]
        each = "  ".join(f"{x:.3f}/{y:+.3f} ({p[0]:.2f}, {p[1]:.2f}; {t[0]:.1f}, {t[1]:.1f})" for x, y, p, t in
                         zip(s["ratio_per_repeat"], b["difference_per_repeat"], r["ptl64_ms_per_repeat"],
                             r["train_us_per_token_per_repeat"]))
        ratios = "-" if busy is None else " ".join(
            f"{k[0].upper()} {busy[k]['measured_over_predicted'] or float('nan'):.2f}" for k in STAGES)
        print(f"{mode:<13} {s['predicted']:>14.1f} {s['measured']:>8.1f} {s['ratio']:>7.3f} "
              f"{b['predicted']:>11.3f} {b['measured']:>6.3f} {b['difference']:>+6.3f}  {ratios:>15}  {each}")
    return rows


def stage_busy(rows: list[dict]) -> dict[str, dict]:
    """Each stage's busy seconds over a mode's repeats (`rows`, one each): the means predicted and
    measured, and measured over predicted (None where nothing was predicted)."""
    out = {}
    for stage in STAGES:
        predicted = statistics.mean(row["predicted"]["busy_s"][stage] for row in rows)
        measured = statistics.mean(row["measured_busy_s"][stage] for row in rows)
        out[stage] = {"predicted": round(predicted, 2), "measured": round(measured, 2),
                      "measured_over_predicted": round(measured / predicted, 3) if predicted > 0 else None}
    return out


def pairs_agreeing(a: dict[str, float], b: dict[str, float]) -> tuple[int, int]:
    """Pairs of policies ordered the same way by both (ties count as agreeing with either)."""
    pairs = list(combinations(sorted(a), 2))
    same = sum((a[x] - a[y]) * (b[x] - b[y]) >= 0 for x, y in pairs)
    return same, len(pairs)


def separated_pairs(runs: dict[str, list[float]]) -> set[tuple[str, str]]:
    """Pairs whose measured means differ by more than twice their combined standard error over
    rounds: the pairs a measured ranking orders at all (none with a single round)."""
    out = set()
    for x, y in combinations(sorted(runs), 2):
        rx, ry = runs[x], runs[y]
        if min(len(rx), len(ry)) < 2:
            continue
        se = (statistics.variance(rx) / len(rx) + statistics.variance(ry) / len(ry)) ** 0.5
        if abs(statistics.mean(rx) - statistics.mean(ry)) > 2 * se:
            out.add((x, y))
    return out


def skew_ranking(args, inv: Invocation, profiler: Profiler) -> dict:
    """bench/skew.py run for real, then each policy's rounds simulated from the profiles taken
    right before (`before`) and right after it (one thread on the trainer's core and on the
    first replica's; the generation times averaged), each round's workload and, for the ranked
    policies, that round's own predictions."""
    out, prompt_tokens = inv.dir, profiler.prompt_tokens
    before = profiler.latest(per_core=True)
    report, runs_of = bench(["bench/skew.py", "--rounds", str(args.skew_rounds), "--iterations",
                             str(args.skew_iterations), "--out", str(out / "skew")], out / "skew.log", inv)
    after = profiler.measure(per_core=True)
    measured, runs = report["generation_s_per_iteration"], report["generation_s_per_run"]
    job = yaml.safe_load(JOB.read_text())
    job["spec"]["algorithm"].update(numIterations=args.skew_iterations, promptsPerStep=64)
    predicted = {}
    for name, (policy, settings) in SKEW.items():
        per_round = []
        for rnd in range(args.skew_rounds):
            for profiles in (before, after):
                # The workload every policy faced (random-fifo's lengths; the oracle read the same
                # file); a ranked policy's predictions are those its own ranker made in that round.
                sc = scenario(f"skew-{name}", "batch", runs_of.run_dir(f"random-fifo-r{rnd}") / "lengths.jsonl",
                              profiles, prompt_tokens, job, replicas=2, dispatch={"policy": policy, **settings},
                              ranker_log_error=args.ranker_log_error)
                if policy == "skewness-aware" and not args.drawn_predictions:
                    sc["workload"]["rankerPredictions"] = str(runs_of.run_dir(f"{name}-r{rnd}") / "lengths.jsonl")
                # iteration 0 is not averaged (bench/skew.py: the ranker has seen nothing yet)
                per_round.append(statistics.mean(r.generation_s
                                                 for r in simulate(parse_scenario(sc)).iterations[1:]))
        predicted[name] = statistics.mean(per_round)
    same, total = pairs_agreeing(predicted, measured)
    separated = separated_pairs(runs)
    same_separated = sum((predicted[x] - predicted[y]) * (measured[x] - measured[y]) > 0 for x, y in separated)
    order = {"predicted": sorted(predicted, key=predicted.get), "measured": sorted(measured, key=measured.get)}
    print(f"{'policy':<20} {'generation s sim':>17} {'real':>8} {'x random-fifo sim':>18} {'real':>6}  rounds")
    for k in SKEW:
        print(f"{k:<20} {predicted[k]:>17.3f} {measured[k]:>8.3f} {predicted[k] / predicted['random-fifo']:>18.3f} "
              f"{measured[k] / measured['random-fifo']:>6.3f}  {' '.join(f'{v:.3f}' for v in runs[k])}")
    print(f"order (fastest first) sim: {', '.join(order['predicted'])}; real: {', '.join(order['measured'])}; "
          f"{same}/{total} pairs ordered alike; of the {len(separated)} pairs the real rounds separate (means "
          f"apart by more than 2 standard errors), {same_separated} ordered alike")
    return {"generation_s": {k: {"predicted": round(predicted[k], 4), "measured": round(measured[k], 4),
                                 "ratio": round(predicted[k] / measured[k], 3)} for k in SKEW},
            "order_fastest_first": order, "pairs_ordered_alike": f"{same}/{total}",
            "separated_pairs": sorted(f"{x} vs {y}" for x, y in separated),
            "separated_pairs_ordered_alike": f"{same_separated}/{len(separated)}",
            "rounds": args.skew_rounds,
            "ranker": "drawn (rankerLogError)" if args.drawn_predictions else "the run's own predictions",
            "ranker_log_error_assumed": args.ranker_log_error}


def memory_bound(args) -> dict:
    """64 H20-class replicas (analytic), a 7B model, output lengths with p99/p50 >= 8, batch mode."""
    data = {
        "name": "memory-bound", "model": "qwen2.5-7b", "pipeline": {"mode": "batch"},
        "algorithm": {"numIterations": args.memory_iterations, "promptsPerStep": 512, "groupSize": 16,
                      "microBatchSize": 4},
        "workload": {"promptTokens": 512, "maxNewTokens": 20000, "rankerLogError": args.ranker_log_error,
                     "lengths": {"type": "lognormal", "median": 1000, "sigma": 0.95, "promptShare": 0.7}},
        # 20K-token samples of a 7B model fit an H800 trainer only with activation checkpointing
        "trainer": {"gpus": 64, "cost": {"type": "analytic", "gpu": "H800", "activationCheckpointing": True}},
        "generators": [{"name": "h20", "replicas": 64, "cost": {"type": "analytic", "gpu": "H20"}}],
    }
    out = {policy: simulate(parse_scenario({**data, "dispatch": {"policy": policy}})).summary.generation_s_mean
           for policy in ("random-fifo", "skewness-aware", "oracle")}
    lengths = np.array(_lengths(data))
    ratio = float(np.percentile(lengths, 99) / np.percentile(lengths, 50))
    print(f"memory-bound (64 x H20, qwen2.5-7b, p99/p50 {ratio:.1f}): generation s/iteration "
          + ", ".join(f"{k} {v:.1f}" for k, v in out.items()))
    return {"generation_s": {k: round(v, 2) for k, v in out.items()},
            "skewness_aware_over_random_fifo": round(out["skewness-aware"] / out["random-fifo"], 3),
            "oracle_over_random_fifo": round(out["oracle"] / out["random-fifo"], 3),
            "length_p99_over_p50": round(ratio, 2), "replicas": 64}


def _lengths(data: dict) -> list[int]:
    from streamrl.simulation.workload import SimWorkload

    sc = parse_scenario(data)
    w = SimWorkload(sc.workload, sc.algorithm.prompts_per_step, sc.algorithm.group_size, sc.seed)
    return [n for j in range(sc.algorithm.num_iterations) for p in w.iteration(j) for n in p.lengths]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=20, help="bench/modes.py iterations")
    p.add_argument("--prompts-per-step", type=int, default=64, help="bench/modes.py prompts per iteration")
    p.add_argument("--repeats", type=int, default=2,
                   help="bench/modes.py runs, each between two profiles; the targets are judged on their means")
    p.add_argument("--skew-rounds", type=int, default=3,
                   help="bench/skew.py rounds (2 or more tell which policy pairs the measurement separates)")
    p.add_argument("--skew-iterations", type=int, default=10, help="bench/skew.py iterations")
    p.add_argument("--skip-skew", action="store_true", help="leave bench/skew.py out")
    p.add_argument("--ranker-log-error", type=float, default=0.5,
                   help="skewness-aware with --drawn-predictions: sd of log(predicted/true length) the simulator "
                        "assumes of the ranker")
    p.add_argument("--drawn-predictions", action="store_true",
                   help="skewness-aware: draw the ranker's predictions (--ranker-log-error) rather than replay those "
                        "its ranker made in each measured round (lengths.jsonl's predicted_length)")
    p.add_argument("--memory-iterations", type=int, default=3)
    p.add_argument("--profile-steps", type=int, default=16,
                   help="decode steps `streamrl profile` times per batch size (its own default, 4, reads "
                        "PTL(64) anywhere from 2.5 to 4 ms on this machine minutes apart)")
    p.add_argument("--out", default="runs/bench-sim-fidelity", help=OUT_HELP)
    args = p.parse_args()
    inv = Invocation(args.out)
    task = counting_prompts(1024, 0)
    prompt_tokens = round(statistics.mean(len(t.text) for t in task)) + 1  # character tokens and BOS
    completion_tokens = round(statistics.mean(len(t.answer) for t in task)) + 1  # and EOS
    profiler = Profiler(inv.dir, prompt_tokens, completion_tokens, args.profile_steps)
    modes = modes_side_by_side(args, inv, profiler)
    skew = None if args.skip_skew else skew_ranking(args, inv, profiler)
    mem = memory_bound(args)
    within = {m: abs(r["samples_per_s"]["ratio"] - 1) <= 0.15 for m, r in modes.items()}
    bubbles = {m: abs(r["pipeline_bubble_ratio"]["difference"]) <= 0.05 for m, r in modes.items()}
    print(inv.report({
        "modes": modes,
        "samples_per_s_within_15pct": within,
        "pipeline_bubble_within_0_05": bubbles,
        "skew": skew,
        "memory_bound": mem,
        "profiles": profiler.taken,
        "profile_steps": args.profile_steps,
        "prompt_tokens": prompt_tokens, "iterations": args.iterations, "prompts_per_step": args.prompts_per_step,
        "repeats": args.repeats,
    }))


if __name__ == "__main__":
    main()
