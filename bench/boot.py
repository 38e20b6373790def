"""Booting generators: from the model directory on disk, or from the trainer (the model's files
over FetchModel, the weights as the trainer's current version, relayed within the pool). For
1, 4 and 8 generators, each way: seconds from the generators' start to the first sample the
trainer accepted from each of them (the slowest is the fleet's), and the bytes every process
(trainer and generators) loaded from the checkpoint's weight files. Prints a table and, as the
last line, a JSON object.

    python bench/boot.py [--counts 1 4 8] [--size small] [--out runs/bench-boot]

Each invocation writes into a new directory under --out (bench/provenance.py): the model
(model/, the built-in architecture at --size: ~134 MB at `small`) and one run directory per
case (disk-1, trainer-1, ...).

Storage reads are what each process's loader counts (streamrl_model_read_bytes: the weight
files from_pretrained reads), not the kernel's counters: on one machine every process shares
the page cache, and safetensors maps the files rather than reading them, so a 134 MB load
shows as ~2 kB of rchar and 0 read_bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import OUT_HELP, Invocation  # noqa: E402
from streamrl.local.ports import free_port  # noqa: E402
from streamrl.metrics import MODEL_READ_BYTES  # noqa: E402
from streamrl.models import build_tiny_model, weight_bytes  # noqa: E402
from streamrl.records import SUMMARY_FILE, RunSummary, TrainerStatus  # noqa: E402

WAYS = ("disk", "trainer")
TIMEOUT_S = 600.0


def job_for(n: int) -> dict:
    job = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    job["metadata"]["name"] = f"bench-boot-{n}"
    spec = job["spec"]
    spec["algorithm"].update(numIterations=2, promptsPerStep=4 * n, groupSize=4, maxNewTokens=16, microBatchSize=16)
    spec["pipeline"] = {"mode": "stream-sync", "minMicroBatchSize": 4}
    spec["trainer"] = {**spec.get("trainer", {}), "minGenerators": n}  # work goes out once all are in
    spec["generators"] = {"pools": [{"name": "default", "replicas": n, "weightRelay": True,
                                     "engine": {"type": "torch", "maxBatchSize": 8}}]}
    return job


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                TOKENIZERS_PARALLELISM="false")


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrl.cli", *argv], env=_env(), cwd=log.parent,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _read_bytes(http: httpx.Client, port: int) -> float:
    for line in http.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
        if line.startswith(f"{MODEL_READ_BYTES}_total "):
            return float(line.split()[1])
    raise RuntimeError(f"port {port}: no {MODEL_READ_BYTES}_total in its /metrics")


def run_case(way: str, n: int, model: Path, job_file: Path, run_dir: Path) -> dict:
    """One case: a trainer, then n generators booting `way`; returns their joins and reads."""
    run_dir.mkdir(parents=True)
    procs: list[subprocess.Popen] = []
    try:
        endpoint = run_dir / "trainer.json"
        trainer = _start(["trainer", str(job_file), "--model-dir", str(model), "--out", str(run_dir / "out"),
                          "--endpoint-file", str(endpoint)], run_dir / "trainer.log")
        procs.append(trainer)
        deadline = time.monotonic() + TIMEOUT_S
        while not endpoint.exists():
            if trainer.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the trainer did not start; see {run_dir / 'trainer.log'}")
            time.sleep(0.05)
        ports = json.loads(endpoint.read_text())
        admin_ports = [ports["admin_port"]]
        started = time.time()
        for k in range(n):
            admin_ports.append(free_port())
            argv = ["generator", str(job_file), "--trainer", f"127.0.0.1:{ports['grpc_port']}", "--id", f"gen-{k}",
                    "--admin-port", str(admin_ports[-1])]
            procs.append(_start(argv + (["--model-dir", str(model)] if way == "disk" else []),
                                run_dir / f"gen-{k}.log"))
        print(f"  {way}, {n} generator(s): started; waiting for every one's first accepted sample", file=sys.stderr)
        with httpx.Client(timeout=5) as http:
            while True:  # every generator joined: its first sample accepted (the trainer's /status says)
                if trainer.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"not every generator joined within {TIMEOUT_S:.0f}s; see {run_dir}")
                st = TrainerStatus.model_validate(http.get(f"http://127.0.0.1:{ports['admin_port']}/status").json())
                if len(st.generators) == n and all(g.join_s is not None for g in st.generators.values()):
                    break
                time.sleep(0.1)
            reads = [_read_bytes(http, port) for port in admin_ports]
        if trainer.wait(timeout=max(1.0, deadline - time.monotonic())) != 0:
            raise RuntimeError(f"the trainer failed; see {run_dir / 'trainer.log'}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    summary = RunSummary.read(run_dir / "out" / SUMMARY_FILE)
    joins = {j.generator_id: j.join_s for j in summary.generator_joins}
    return {"first_sample_s": max(joins.values()), "join_s": joins, "started_unix": started,
            "read_bytes": {"trainer": reads[0], "generators": sum(reads[1:])}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--counts", type=int, nargs="+", default=[1, 4, 8], help="generator counts (default 1 4 8)")
    p.add_argument("--size", choices=["tiny", "small"], default="small",
                   help="the built-in architecture to boot (default small, ~134 MB of float32 weights)")
    p.add_argument("--out", default="runs/bench-boot", help=OUT_HELP)
    args = p.parse_args()
    inv = Invocation(args.out)
    model = build_tiny_model(inv.dir / "model", seed=0, size=args.size)
    checkpoint = weight_bytes(model)
    print(f"model: {checkpoint / 1e6:.0f} MB of weights in {model}", file=sys.stderr)
    cases: dict[str, dict[str, dict]] = {way: {} for way in WAYS}
    for n in args.counts:
        job_file = inv.dir / f"job-{n}.yaml"
        job_file.write_text(yaml.safe_dump(job_for(n)))
        for way in WAYS:
            cases[way][str(n)] = run_case(way, n, model, job_file, inv.run_dir(f"{way}-{n}"))

    print(f"\n{'generators':>10} {'way':>8} {'first sample (slowest), s':>26} {'storage reads / checkpoint':>27}")
    reads = {way: {} for way in WAYS}
    first = {way: {} for way in WAYS}
    for n in args.counts:
        for way in WAYS:
            c = cases[way][str(n)]
            reads[way][str(n)] = round((c["read_bytes"]["trainer"] + c["read_bytes"]["generators"]) / checkpoint, 3)
            first[way][str(n)] = round(c["first_sample_s"], 2)
            print(f"{n:>10} {way:>8} {first[way][str(n)]:>26.2f} {reads[way][str(n)]:>27.2f}")
    largest = str(max(args.counts))
    result = {
        "checkpoint_bytes": checkpoint,
        "storage_reads_over_checkpoint": reads,
        "first_sample_s": first,
        "join_s": {way: {n: c["join_s"] for n, c in cases[way].items()} for way in WAYS},
        "trainer_reads_once": all(v <= 1.2 for v in reads["trainer"].values()),
        "trainer_no_slower_at_largest": first["trainer"][largest] <= first["disk"][largest],
    }
    print(inv.report(result))


if __name__ == "__main__":
    main()
