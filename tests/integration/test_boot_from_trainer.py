"""Generators that boot from the trainer, as real processes over real gRPC: no model
directory, no cache to build one in; the model's files come over FetchModel, the weights as
the trainer's version, and in a relay pool only one replica takes each version from the
trainer."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.records import IterationRecord, RunSummary
from tests.conftest import child_env

JOB = {
    "spec": {
        "algorithm": {"numIterations": 3, "promptsPerStep": 8, "groupSize": 4, "maxNewTokens": 32,
                      "microBatchSize": 16},
        "pipeline": {"mode": "stream-sync", "minMicroBatchSize": 4},
        "trainer": {"minGenerators": 2},
        "generators": {"pools": [{"name": "default", "replicas": 2, "weightRelay": True,
                                  "engine": {"type": "torch", "maxBatchSize": 8}}]},
    }
}


def _start(argv: list[str], log: Path, env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrl.cli", *argv], env=env, cwd=cwd,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait(proc: subprocess.Popen, timeout_s: float, log: Path) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{log.name} did not finish within {timeout_s:.0f}s:\n{log.read_text()[-3000:]}")


def test_generators_without_the_model_boot_from_the_trainer_and_train_to_the_end(tmp_path, write_job, tiny_model_dir):
    job = write_job(JOB)
    endpoint_file, out = tmp_path / "trainer.json", tmp_path / "out"
    procs = []
    try:
        trainer = _start(["trainer", str(job), "--model-dir", str(tiny_model_dir), "--out", str(out),
                          "--endpoint-file", str(endpoint_file)], tmp_path / "trainer.log", child_env(), tmp_path)
        procs.append(trainer)
        deadline = time.monotonic() + 120
        while not endpoint_file.exists():
            assert trainer.poll() is None, (tmp_path / "trainer.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the trainer did not start"
            time.sleep(0.05)
        address = f"127.0.0.1:{json.loads(endpoint_file.read_text())['grpc_port']}"
        # The generators know no model: no --model-dir, and a cache with nothing in it, where a
        # replica resolving the job's model itself would build and warm-start one.
        empty_cache = tmp_path / "generator-cache"
        empty_cache.mkdir()
        gen_env = dict(child_env(), STREAMRL_CACHE_DIR=str(empty_cache))
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        for gid in ("gen-a", "gen-b"):
            procs.append(_start(["generator", str(job), "--trainer", address, "--id", gid],
                                tmp_path / f"{gid}.log", gen_env, elsewhere))
        assert _wait(trainer, 240, tmp_path / "trainer.log") == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    assert summary.phase == "Succeeded" and summary.num_iterations == 3
    records = [IterationRecord.model_validate_json(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r.iteration for r in records] == [0, 1, 2]
    for gid in ("gen-a", "gen-b"):
        log = (tmp_path / f"{gid}.log").read_text()
        assert "booting from the trainer: 4 model files" in log, log[-2000:]
        assert "first sample sent" in log, log[-2000:]
    assert list(empty_cache.iterdir()) == []  # nothing resolved or built on the generators' side
    # v0, the weights both booted with: one copy from the trainer, the other from the peer holding it
    v0 = records[0]
    assert v0.weight_bytes_from_trainer > 0
    assert v0.weight_bytes_from_peers == v0.weight_bytes_from_trainer
