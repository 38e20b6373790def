"""`streamrl run` of the tiny job with `engine.type: vllm` (vLLM's CPU build) in every mode: the
generator boots from the trainer on dummy weights, loads every version in place, and the job
learns with every sample trained once within the mode's staleness bound. In stream-async its
replica is SIGKILLed as a version arrives and is replaced, losing nothing; colocated says that
vLLM cannot sleep on CPU."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from streamrl.records import EVENTS_FILE, RunEvent, RunSummary, TrainerStatus
from tests.conftest import child_env

PROMPTS, GROUP, WINDOW = 64, 8, 5
ITERATIONS = 20
KILL_AT_VERSION = 4
ENGINE = {"type": "vllm", "device": "cpu", "maxNumSeqs": 64, "enforceEager": True, "cpuKvCacheGib": 0.5}


def _trainer_version(out: Path) -> int:
    try:
        admin = json.loads((out / "trainer.json").read_text())["admin_port"]
        status = TrainerStatus.model_validate_json(httpx.get(f"http://127.0.0.1:{admin}/status", timeout=2).content)
    except (OSError, ValueError, KeyError, httpx.HTTPError):
        return -1
    return status.policy_version


def _kill_as_a_version_arrives(run: subprocess.Popen, out: Path, said: Path) -> None:
    """SIGKILL generator-default-0 the moment the trainer publishes KILL_AT_VERSION: the replica
    is fetching or loading it then."""
    deadline = time.monotonic() + 300
    while _trainer_version(out) < KILL_AT_VERSION:
        assert run.poll() is None, said.read_text()[-3000:]
        assert time.monotonic() < deadline, f"the trainer did not publish v{KILL_AT_VERSION} within 300 s"
        time.sleep(0.01)
    pid = json.loads((out / "endpoints" / "generator-default-0.json").read_text())["pid"]
    subprocess.run(["kill", "-KILL", str(pid)], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stream-async", "stream-sync", "batch", "colocated"])
def test_vllm_learns_in_every_mode_and_trains_every_sample_once(mode, write_job, tmp_path):
    iterations = ITERATIONS
    job = write_job({"spec": {
        "algorithm": {"numIterations": iterations, "promptsPerStep": PROMPTS, "groupSize": GROUP,
                      "learningRate": 3.0e-4},
        "pipeline": {"mode": mode},
        "generators": {"pools": [{"name": "default", "replicas": 1, "engine": ENGINE}]},
    }})
    out = tmp_path / "run"
    said = tmp_path / "said.log"
    run = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out)],
                           env=child_env(), stdout=said.open("w"), stderr=subprocess.STDOUT, text=True)
    try:
        if mode == "stream-async":
            _kill_as_a_version_arrives(run, out, said)
        assert run.wait(600) == 0, said.read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            run.wait(120)

    if mode == "colocated":
        log = (out / "logs" / "trainer.log").read_text()
        assert "vLLM has no sleep mode on this platform, so its KV cache (0.5 GiB) stays allocated" in log
    else:
        log = (out / "logs" / "generator-default-0.log").read_text()
        assert "(pool default, vllm engine, batch 64)" in log
        assert "load_format=dummy" in log  # booted from the trainer: no weights until the first version
    if mode == "stream-async":
        replaced = [(e.process, e.detail) for e in RunEvent.read_lines(out / EVENTS_FILE) if e.kind == "replaced"]
        assert replaced == [("generator-default-0", "by generator-default-1")]
        assert "load_format=dummy" in (out / "logs" / "generator-default-1.log").read_text()

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in records] == list(range(1, iterations + 1))
    assert max(r["staleness_max"] for r in records) == (1 if mode == "stream-async" else 0)
    first = sum(r["reward_mean"] for r in records[:WINDOW]) / WINDOW
    last = sum(r["reward_mean"] for r in records[-WINDOW:]) / WINDOW
    assert last - first >= 0.05, f"{mode}: reward {first:.3f} -> {last:.3f}"

    summary = RunSummary.read(out / "summary.json")
    assert summary.num_iterations == iterations
    assert summary.num_samples_accepted == iterations * PROMPTS * GROUP  # each sample once
    assert summary.num_samples_duplicate_dropped == 0
    assert summary.num_samples_stale_dropped == 0
