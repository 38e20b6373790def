"""Real trainer and generator processes on loopback ports, talking real gRPC."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from streamrl.records import IterationRecord, RunSummary, TrainerStatus
from tests.conftest import child_env


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrl.cli", *argv], env=child_env(),
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait_file(path: Path, proc: subprocess.Popen, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"trainer exited early with {proc.returncode}"
        assert time.monotonic() < deadline, "trainer did not start"
        time.sleep(0.05)
    return json.loads(path.read_text())


@pytest.fixture
def services(tmp_path, write_job, tiny_model_dir):
    """Start a trainer; yield a helper that starts generators; stop everything after."""
    procs: list[subprocess.Popen] = []

    def start(job_overrides: dict, generator_ids: list[str]):
        job = write_job(job_overrides)
        endpoint_file = tmp_path / "trainer.json"
        trainer = _start(["trainer", str(job), "--model-dir", str(tiny_model_dir), "--out", str(tmp_path / "out"),
                          "--endpoint-file", str(endpoint_file)], tmp_path / "trainer.log")
        procs.append(trainer)
        endpoint = _wait_file(endpoint_file, trainer)
        gens = {}
        for gid in generator_ids:
            gens[gid] = _start(["generator", str(job), "--trainer", f"127.0.0.1:{endpoint['grpc_port']}",
                                "--id", gid, "--model-dir", str(tiny_model_dir)], tmp_path / f"{gid}.log")
            procs.append(gens[gid])
        return trainer, gens, endpoint

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


JOB = {
    "spec": {
        "algorithm": {"numIterations": 3, "promptsPerStep": 12, "groupSize": 4, "maxNewTokens": 48,
                      "microBatchSize": 16},
        "pipeline": {"mode": "stream-sync", "minMicroBatchSize": 4},
        "generators": {"pools": [{"name": "default", "replicas": 2, "engine": {"type": "torch", "maxBatchSize": 4}}]},
    }
}


def test_generator_that_dies_mid_iteration_has_its_samples_redispatched_and_none_counted_twice(services, tmp_path):
    trainer, gens, endpoint = services(JOB, ["gen-a", "gen-b"])
    admin = f"http://127.0.0.1:{endpoint['admin_port']}"
    killed = False
    deadline = time.monotonic() + 120
    with httpx.Client(timeout=2) as http:
        while not killed and time.monotonic() < deadline:
            st = TrainerStatus.model_validate(http.get(f"{admin}/status").json())
            b = st.generators.get("gen-b")
            # Kill gen-b once it has delivered some samples and still holds unfinished ones.
            if b and b.num_samples >= 2 and b.outstanding > 0:
                gens["gen-b"].send_signal(signal.SIGKILL)
                killed = True
            time.sleep(0.02)
    assert killed, "gen-b never had work in flight"
    assert trainer.wait(timeout=180) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    summary = RunSummary.read(tmp_path / "out/summary.json")
    expected = 3 * 12 * 4
    assert summary.phase == "Succeeded"
    assert summary.num_samples_accepted == expected
    assert summary.num_samples_redispatched >= 1
    assert summary.num_samples_duplicate_dropped == 0
    assert summary.num_samples_refused == {}  # real generators' samples pass every intake check
    assert summary.num_prompts_dispatched > 3 * 12  # the re-dispatches are extra assignments
    records = IterationRecord.read_lines(tmp_path / "out/metrics.jsonl")
    assert [r.num_samples for r in records] == [48, 48, 48]
    assert [r.policy_version for r in records] == [1, 2, 3]


def test_admin_surface_serves_health_readiness_metrics_and_status(services, tmp_path):
    job = {"spec": {**JOB["spec"], "algorithm": {**JOB["spec"]["algorithm"], "numIterations": 2},
                    "checkpoint": {"everyIterations": 1}}}
    trainer, gens, endpoint = services(job, ["gen-a"])
    admin = f"http://127.0.0.1:{endpoint['admin_port']}"
    with httpx.Client(timeout=2) as http:
        assert http.get(f"{admin}/healthz").json() == {"ok": True}
        deadline = time.monotonic() + 60
        while http.get(f"{admin}/readyz").status_code != 200:
            assert time.monotonic() < deadline and trainer.poll() is None, "trainer never became ready"
            time.sleep(0.05)
        metrics = http.get(f"{admin}/metrics").text
        assert "streamrl_connected_generators 1.0" in metrics
        # Start-up waiting for generators is its own reason, not a pipeline bubble.
        assert 'streamrl_stage_idle_seconds_total{reason="waiting_generators",stage="trainer"}' in metrics
        assert 'streamrl_phase{phase="Running"} 1.0' in metrics
        assert 'streamrl_phase{phase="WaitingForGenerators"} 0.0' in metrics
        assert "streamrl_max_staleness 0.0" in metrics  # stream-sync: the contract is 0
        st = TrainerStatus.model_validate(http.get(f"{admin}/status").json())
        assert st.mode == "stream-sync" and st.num_iterations == 2 and "gen-a" in st.generators
        # The replica measured PTL(BS) at start-up and said so in its Hello.
        profile = st.generators["gen-a"].latency_profile
        assert [b for b, _ in profile] == [1, 2, 4] and all(s > 0 for _, s in profile)
    assert trainer.wait(timeout=120) == 0
    assert gens["gen-a"].wait(timeout=30) == 0  # the trainer closed its stream: a clean exit
    assert (tmp_path / "out" / "model" / "model.safetensors").is_file()
    # A checkpoint each iteration (the newest checkpoint.keep = 2 kept), each whole: its manifest written last.
    for name in ("iter-00001", "iter-00002"):
        files = {p.name for p in (tmp_path / "out" / "checkpoints" / name).iterdir()}
        assert files == {".metadata", "__0_0.distcp", "rank-0.pt", "trainer.json", "manifest.json"}, name


def test_ctrl_c_stops_every_process_and_keeps_the_summary_and_model(write_job, tiny_model_dir, tmp_path):
    job = write_job({"spec": {**JOB["spec"], "model": {"source": "path", "path": str(tiny_model_dir)},
                              "algorithm": {**JOB["spec"]["algorithm"], "numIterations": 1000}}})
    out = tmp_path / "run"
    runner = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out)],
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert runner.poll() is None and time.monotonic() < deadline, "run did not get going"
        time.sleep(0.1)
    runner.send_signal(signal.SIGINT)
    output, _ = runner.communicate(timeout=60)
    assert runner.returncode == 130, output[-2000:]
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == "Interrupted"
    assert summary.num_iterations >= 2
    assert (out / "model/model.safetensors").is_file()
    assert "interrupted" in output
    # No trainer or generator is left behind (their command lines name the run directory).
    assert subprocess.run(["pgrep", "-f", str(out)], capture_output=True).returncode == 1


def test_skewness_aware_run_completes_every_prompt_when_a_replica_dies(write_job, tiny_model_dir, tmp_path):
    job = write_job({"spec": {
        **JOB["spec"],
        "model": {"source": "path", "path": str(tiny_model_dir)},
        "algorithm": {**JOB["spec"]["algorithm"], "numIterations": 4},
        "trainer": {"minGenerators": 2},
        "generators": {"dispatch": {"policy": "skewness-aware", "longTailBatchCap": 2},
                       "pools": [{"name": "default", "replicas": 2,
                                  "engine": {"type": "torch", "maxBatchSize": 4}}]},
    }})
    out = tmp_path / "run"
    runner = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"],
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    killed = False
    while not killed:
        assert runner.poll() is None and time.monotonic() < deadline, "never saw default-1 with work in flight"
        try:
            admin = json.loads((out / "trainer.json").read_text())["admin_port"]
            st = TrainerStatus.model_validate(httpx.get(f"http://127.0.0.1:{admin}/status", timeout=2).json())
            gen = st.generators.get("default-1")
        except (OSError, ValueError, httpx.HTTPError):
            gen = None
        if gen and gen.num_samples >= 2 and gen.outstanding > 0:
            subprocess.run(["pkill", "-KILL", "-f", f"generator .*{out}.* --id default-1"], check=True)
            killed = True
        time.sleep(0.02)
    output, _ = runner.communicate(timeout=180)
    assert runner.returncode == 0, output[-3000:]
    summary = RunSummary.read(out / "summary.json")
    assert summary.num_samples_accepted == 4 * 12 * 4
    assert summary.num_samples_redispatched >= 1 and summary.num_samples_duplicate_dropped == 0
    ranked = (out / "logs/trainer.log").read_text()
    assert "long-tail plan:" in ranked
    records = IterationRecord.read_lines(out / "metrics.jsonl")
    assert all(r.actual_length_mean > 0 and r.predicted_length_mean is not None for r in records)
    # lengths.jsonl keeps each prompt's prediction beside its lengths: per iteration, their mean
    # is the one metrics.jsonl reports.
    lines = [json.loads(line) for line in (out / "lengths.jsonl").read_text().splitlines()]
    assert len(lines) == 4 * 12 and all(line["predicted_length"] >= 0 for line in lines)
    for r in records:
        mine = [line["predicted_length"] for line in lines if line["prompt_id"].startswith(f"{r.iteration}-")]
        assert sum(mine) / len(mine) == pytest.approx(r.predicted_length_mean, abs=1e-2)
    assert (out / "ranker.npz").is_file()  # the ranker learnt and saved its state on the way out
