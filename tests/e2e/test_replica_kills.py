"""A killed replica is replaced: `streamrl run` (stream-async, 2 generators) with the same
replica slot SIGKILLed five times within a minute, each time once its replica served,
replaces it at once every time (no backoff) and finishes; every iteration is in
metrics.jsonl once and the ledger has every prompt trained once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from streamrl.records import EVENTS_FILE, IterationRecord, LocalRun, RunEvent, RunSummary, TrainerPhase, TrainerStatus
from tests.conftest import child_env

pytestmark = pytest.mark.slow

ITERATIONS, PROMPTS, GROUP, KILLS = 120, 8, 4, 5


def _served(out: Path, replica: str) -> bool:
    """The trainer accepted a sample of `replica` (its /status says so)."""
    try:
        admin = json.loads((out / "trainer.json").read_text())["admin_port"]
        status = TrainerStatus.model_validate_json(httpx.get(f"http://127.0.0.1:{admin}/status", timeout=2).content)
    except (OSError, ValueError, KeyError, httpx.HTTPError):
        return False
    g = status.generators.get(replica)
    return (g is not None and g.num_samples > 0) or any(j.generator_id == replica for j in status.generator_joins)


def _pid(out: Path, name: str) -> int | None:
    try:
        return json.loads((out / "endpoints" / f"{name}.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def test_the_same_slot_killed_five_times_within_a_minute_is_replaced_each_time_and_the_run_finishes(
        write_job, tmp_path):
    job = write_job({"spec": {
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": PROMPTS, "groupSize": GROUP},
        "pipeline": {"mode": "stream-async"},
        "generators": {"pools": [{"name": "default", "replicas": 2}]},
    }})
    out = tmp_path / "run"
    said = tmp_path / "said.log"  # what it says (a file: a pipe nobody reads would fill and block it)
    run = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out)],
                           env=child_env(), stdout=said.open("w"), stderr=subprocess.STDOUT, text=True)
    kills: list[tuple[str, float]] = []
    try:
        # Slot default-0's replicas: generator-default-0, then (default-1 is the other slot's) -2, -3 ...
        for n in [0, *range(2, KILLS + 1)]:
            name, replica = f"generator-default-{n}", f"default-{n}"
            deadline = time.monotonic() + 120
            while not (_served(out, replica) and (pid := _pid(out, name))):
                assert run.poll() is None, said.read_text()[-3000:]
                assert time.monotonic() < deadline, f"{name} did not serve within 120 s (kills so far: {kills})"
                time.sleep(0.05)
            subprocess.run(["kill", "-KILL", str(pid)], check=True)
            kills.append((name, time.monotonic()))
        assert kills[-1][1] - kills[0][1] < 60, f"five kills took {kills[-1][1] - kills[0][1]:.0f} s"
        assert IterationRecord.read_lines(out / "metrics.jsonl")[-1].iteration < ITERATIONS - 1, "the run ended first"
        assert run.wait(600) == 0, f"kills {kills}: " + said.read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            run.wait(120)
    lines = said.read_text()
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == TrainerPhase.SUCCEEDED and summary.num_iterations == ITERATIONS
    records = IterationRecord.read_lines(out / "metrics.jsonl")
    assert [r.iteration for r in records] == list(range(ITERATIONS))
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    trained = [pid for e in ledger for pid in e["prompt_ids"]]
    assert len(trained) == len(set(trained)) == ITERATIONS * PROMPTS
    assert {pid.split("-")[0] for pid in trained} == {str(i) for i in range(ITERATIONS)}
    # Each killed replica had served: replaced at once, never backed off.
    events = RunEvent.read_lines(out / EVENTS_FILE)
    replaced = [(e.process, e.detail) for e in events if e.kind == "replaced"]
    assert replaced == [(name, f"by generator-default-{n + 1 if n else 2}")
                        for name, n in ((k, int(k.rsplit("-", 1)[1])) for k, _ in kills)]
    assert not [e for e in events if e.kind == "backoff"]
    assert "crash-looping" not in lines and "generator-default-5 exited with -9; started generator-default-6 in its " \
                                            "place" in lines
    assert LocalRun.read(out / "run.json").generator_replicas_started == 2 + KILLS
