"""Chaos: a stream-async run with 2 generators, killed at random (10 generator SIGKILLs and 2
trainer SIGKILLs at seeded random iterations), beside an undisturbed run of the same job.

Reports whether it finished, prompts trained twice and prompts lost (from the ledger:
target 0 and 0), iterations trained on fewer samples than their batch (target 0), samples
re-dispatched, the seconds from each trainer kill to the next trained iteration (target
<= 30 s here), the share of iteration time the trainer waited on checkpoint saves (target
<= 5%) and the final reward beside the undisturbed run's (within the printed noise: the
standard deviation of the undisturbed run's last iterations). The last line is a JSON object.

    python bench/chaos.py [--iterations 60] [--seed N] [--generator-kills 10] [--trainer-kills 2]
                          [--out runs/bench-chaos]

Each invocation runs in a new directory under --out (bench/provenance.py): job.yaml, and the run
directories calm/ (undisturbed) and chaos/.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import OUT_HELP, Invocation  # noqa: E402
from streamrl.records import (  # noqa: E402
    EVENTS_FILE,
    LOCAL_RUN_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    IterationRecord,
    LocalRun,
    RunEvent,
    RunSummary,
)

EXAMPLE = ROOT / "deploy" / "examples" / "rljob-tiny-cpu.yaml"
TAIL = 10
"""Iterations the final reward is averaged over."""


def _job(path: Path, iterations: int) -> Path:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["name"] = "chaos"
    job["spec"]["algorithm"].update(numIterations=iterations, promptsPerStep=8)
    job["spec"]["pipeline"] = {"mode": "stream-async"}
    job["spec"]["generators"] = {"pools": [{"name": "default", "replicas": 2}]}
    job["spec"]["checkpoint"] = {"everyIterations": 5, "keep": 2}
    job["spec"]["trainer"] = {"restartLimit": 5}
    path.write_text(yaml.safe_dump(job))
    return path


def _iterations(out: Path) -> list[IterationRecord]:
    path = out / METRICS_FILE
    try:
        return IterationRecord.read_lines(path) if path.exists() else []
    except ValueError:
        return []  # being rewritten by a resuming trainer


def _pids(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


class Killer(threading.Thread):
    """Kills at the planned iterations: ('generator' | 'trainer', after iteration n)."""

    def __init__(self, out: Path, plan: list[tuple[int, str]], rng: random.Random):
        super().__init__(daemon=True)
        self.out, self.plan, self.rng = out, sorted(plan), rng
        self.kills: list[dict] = []
        self.done = threading.Event()

    def run(self) -> None:
        pending = list(self.plan)
        while pending and not self.done.is_set():
            trained = len(_iterations(self.out))
            if trained >= pending[0][0]:
                at, what = pending.pop(0)
                pattern = f"{self.out}/trainer.json" if what == "trainer" else f"{self.out}/endpoints/generator-"
                pids = _pids(pattern)
                if not pids:  # between a death and its replacement: try again shortly
                    pending.insert(0, (at, what))
                    time.sleep(0.2)
                    continue
                pid = self.rng.choice(pids)
                subprocess.run(["kill", "-KILL", str(pid)], check=False)
                self.kills.append({"what": what, "pid": pid, "after_iteration": trained, "time_unix": time.time()})
                print(f"  killed the {what} (pid {pid}) after iteration {trained}", flush=True)
            time.sleep(0.05)


def _run(job: Path, out: Path, killer: Killer | None, timeout_s: float) -> int:
    proc = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"],
                            stderr=subprocess.PIPE, text=True)
    if killer is not None:
        killer.start()
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    if killer is not None:
        killer.done.set()
    if proc.returncode:
        print(stderr[-3000:], file=sys.stderr)
    return proc.returncode


def _recovery(out: Path, kills: list[dict]) -> list[float]:
    """Seconds from each trainer kill to the next iteration trained."""
    records = _iterations(out)
    out_s = []
    for k in (k for k in kills if k["what"] == "trainer"):
        after = [r.time_unix for r in records if r.time_unix and r.time_unix > k["time_unix"]]
        out_s.append(round(min(after) - k["time_unix"], 2) if after else float("inf"))
    return out_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--generator-kills", type=int, default=10)
    ap.add_argument("--trainer-kills", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default="runs/bench-chaos", help=OUT_HELP)
    args = ap.parse_args()
    inv = Invocation(args.out)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    rng = random.Random(seed)
    last = args.iterations - 3
    plan = [(rng.randint(2, last), "generator") for _ in range(args.generator_kills)]
    plan += [(rng.randint(3, last), "trainer") for _ in range(args.trainer_kills)]
    job = _job(inv.dir / "job.yaml", args.iterations)
    print("undisturbed run ...", flush=True)
    calm = inv.run_dir("calm")
    calm_rc = _run(job, calm, None, args.timeout)
    print(f"chaos run: kills after iterations {sorted(plan)} ...", flush=True)
    out = inv.run_dir("chaos")
    killer = Killer(out, plan, rng)
    rc = _run(job, out, killer, args.timeout)
    print(inv.report(_measure(out, calm, killer.kills, rc, calm_rc, args.iterations, seed)))


def _measure(out: Path, calm: Path, kills: list[dict], rc: int, calm_rc: int, iterations: int, seed: int) -> dict:
    job = yaml.safe_load((out / "job.yaml").read_text())
    prompts, group = job["spec"]["algorithm"]["promptsPerStep"], job["spec"]["algorithm"]["groupSize"]
    summary = RunSummary.read(out / SUMMARY_FILE) if (out / SUMMARY_FILE).exists() else None
    records = _iterations(out)
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()] \
        if (out / "ledger.jsonl").exists() else []
    trained = [pid for entry in ledger for pid in entry["prompt_ids"]]
    expected = {f"{i}-{k}" for i in range(iterations) for k in range(prompts)}
    got = {"-".join(pid.split("-")[:2]) for pid in trained}
    incarnation = summary.incarnation if summary else 0
    this_start = {e["iteration"] for e in ledger if e["incarnation"] == incarnation}
    wall_this_start = sum(r.wall_s for r in records if r.iteration in this_start)
    calm_records = _iterations(calm)
    calm_tail = [r.reward_mean for r in calm_records[-TAIL:]]
    local = LocalRun.read(out / LOCAL_RUN_FILE) if (out / LOCAL_RUN_FILE).exists() else None
    events = RunEvent.read_lines(out / EVENTS_FILE) if (out / EVENTS_FILE).exists() else []
    recovery = _recovery(out, kills)
    reward = statistics.fmean(r.reward_mean for r in records[-TAIL:]) if records else None
    return {
        "seed": seed,
        "finished": rc == 0 and summary is not None and summary.num_iterations == iterations,
        "exit_code": rc,
        "iterations_in_metrics": len(records),
        "iterations_once": [r.iteration for r in records] == list(range(iterations)),
        "generator_kills": sum(k["what"] == "generator" for k in kills),
        "trainer_kills": sum(k["what"] == "trainer" for k in kills),
        "trainer_restarts": local.trainer_restarts if local else None,
        "generator_replicas_started": local.generator_replicas_started if local else None,
        "prompts_trained_twice": len(trained) - len(set(trained)),
        "prompts_lost": len(expected - got),
        "iterations_short_of_their_batch": sum(r.num_samples < prompts * group for r in records),
        "samples_redispatched_last_start": summary.num_samples_redispatched if summary else None,
        "samples_of_earlier_starts_dropped": summary.num_samples_previous_incarnation if summary else None,
        "trainer_kill_to_next_iteration_s": recovery,
        "checkpoint_wait_share": round(summary.checkpoint_wait_s / wall_this_start, 4)
        if summary and wall_this_start else None,
        "events": {kind: sum(e.kind == kind for e in events) for kind in sorted({e.kind for e in events})},
        "reward_final": round(reward, 4) if reward is not None else None,
        "reward_final_undisturbed": round(statistics.fmean(calm_tail), 4) if calm_tail else None,
        "reward_noise": round(statistics.pstdev(calm_tail), 4) if len(calm_tail) > 1 else None,
        "undisturbed_exit_code": calm_rc,
        "targets_met": {
            "no_prompt_twice": len(trained) == len(set(trained)),
            "no_prompt_lost": not (expected - got),
            "recovery_within_30_s": all(s <= 30 for s in recovery),
        },
    }


if __name__ == "__main__":
    main()
