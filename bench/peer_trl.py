"""StreamRL (stream-async) next to Hugging Face TRL's GRPOTrainer, in one run: the same
task and prompts, the same warm-started tiny model, group size, learning rate and number
of samples, two cores each. TRL runs in its own virtual environment, which this script
creates on first use (offline afterwards; torch pinned to the local CPU build).
Prints samples/s of each, their ratio and the reward after the same number of samples;
the last line is a JSON object.

    python bench/peer_trl.py [--iterations 20] [--prompts-per-step 64] [--venv runs/trl-venv]
                             [--out runs/bench-peer-trl]

Each invocation runs in a new directory under --out (bench/provenance.py): the prompts and both
configurations, and the run directories trl/ and streamrl/. The TRL environment (--venv) is kept.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import OUT_HELP, Invocation  # noqa: E402
from streamrl.models import resolve_model_dir  # noqa: E402
from streamrl.records import METRICS_FILE, SUMMARY_FILE, IterationRecord, RunSummary  # noqa: E402
from streamrl.spec import parse_job  # noqa: E402
from streamrl.tasks import load_prompts  # noqa: E402

TRL_REQUIREMENTS = ["trl==1.16.*", "datasets", "accelerate"]


def ensure_trl_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import trl"], capture_output=True).returncode == 0:
        return python
    print(f"creating TRL's environment in {venv} (once)", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "-c", str(ROOT / "constraints.txt")]
    subprocess.run(pip + ["torch==2.13.0"], check=True)
    subprocess.run(pip + TRL_REQUIREMENTS, check=True)
    return python


def job(args) -> dict:
    example = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    example["metadata"]["name"] = "peer-trl-streamrl"
    spec = example["spec"]
    spec["algorithm"].update(numIterations=args.iterations, promptsPerStep=args.prompts_per_step,
                             learningRate=args.learning_rate)
    spec["pipeline"] = {"mode": "stream-async"}
    return example


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--prompts-per-step", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--venv", default="runs/trl-venv", help="TRL's virtual environment (created on first use, kept)")
    p.add_argument("--out", default="runs/bench-peer-trl", help=OUT_HELP)
    args = p.parse_args()
    inv = Invocation(args.out)
    out = inv.dir
    trl_python = ensure_trl_venv(Path(args.venv).resolve())

    rljob = job(args)
    spec = parse_job(rljob).spec
    model_dir = resolve_model_dir(spec)
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": q.text, "answer": q.answer}) + "\n"
                               for q in load_prompts(spec.task)))
    algo = spec.algorithm
    cfg = {"model_dir": str(model_dir), "prompts": str(prompts), "out": str(inv.run_dir("trl")), "threads": 2,
           "group_size": algo.group_size, "prompts_per_step": algo.prompts_per_step,
           "micro_batch_size": algo.micro_batch_size, "max_new_tokens": algo.max_new_tokens,
           "learning_rate": algo.learning_rate, "iterations": algo.num_iterations, "seed": algo.seed}
    (out / "trl.json").write_text(json.dumps(cfg))
    env = {"OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    trl_run = subprocess.run([str(trl_python), str(ROOT / "bench/trl_grpo.py"), str(out / "trl.json")],
                             capture_output=True, text=True, env=env)
    if trl_run.returncode != 0:
        sys.exit(f"TRL run failed:\n{trl_run.stderr[-3000:]}")
    trl = json.loads(trl_run.stdout.strip().splitlines()[-1])

    job_file = out / "streamrl.yaml"
    job_file.write_text(yaml.safe_dump(rljob))
    run_dir = inv.run_dir("streamrl")
    subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job_file), "--out", str(run_dir), "--quiet"],
                   check=True)
    ours = RunSummary.read(run_dir / SUMMARY_FILE)
    records = IterationRecord.read_lines(run_dir / METRICS_FILE)

    last = max(1, args.iterations // 4)  # reward over the last quarter of the samples
    result = {
        "samples": trl["samples"],
        "trl_samples_per_s": round(trl["samples_per_s"], 1),
        "streamrl_samples_per_s": round(ours.samples_per_s, 1),
        "ratio": round(ours.samples_per_s / trl["samples_per_s"], 2),
        "trl_reward_last": round(mean(trl["rewards"][-last:]), 4),
        "streamrl_reward_last": round(mean([r.reward_mean for r in records[-last:]]), 4),
        "trl_reward_first": round(mean(trl["rewards"][:last]), 4),
        "streamrl_reward_first": round(mean([r.reward_mean for r in records[:last]]), 4),
    }
    print(f"{'':10} {'samples/s':>10} {'reward first':>13} {'reward last':>12}")
    print(f"{'TRL':10} {result['trl_samples_per_s']:>10} {result['trl_reward_first']:>13} "
          f"{result['trl_reward_last']:>12}")
    print(f"{'StreamRL':10} {result['streamrl_samples_per_s']:>10} {result['streamrl_reward_first']:>13} "
          f"{result['streamrl_reward_last']:>12}")
    print(inv.report(result))


if __name__ == "__main__":
    main()
