"""A trainer restart is never a generator restart: a real generator process outlives a
SIGKILLed trainer process, backs off while nothing listens, and when a trainer starts again on
the same port the same process says Hello again, is welcomed by the new start, rolls its
weights back to the new trainer's version and generates the new run to its end. A generator
that cannot reach its trainer again gives up loudly after the spec's deadline; one asked to
drain meanwhile leaves at once. A generator whose trainer is not up yet (queued, loading)
waits for it without a deadline unless one is set, not ready and saying what it waits for,
and serves once it comes."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from streamrl.generator.agent import GeneratorAgent
from streamrl.generator.torch_engine import TorchEngine
from streamrl.local.ports import free_port
from streamrl.metrics import ServiceMetrics
from streamrl.models import load_model
from streamrl.records import IterationRecord, RunSummary, TrainerStatus
from streamrl.spec import ReconnectSpec
from streamrl.weights import WeightStore
from tests.conftest import child_env
from tests.integration.inproc import AgentThread, TrainerServer

ITERATIONS, PROMPTS, GROUP = 3, 12, 4


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrl.cli", *argv], env=child_env(), stdout=log.open("w"),
                            stderr=subprocess.STDOUT)


def _wait(cond, what: str, procs: list[subprocess.Popen], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        for p in procs:
            assert p.poll() is None, f"{p.args[3]} exited with {p.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _samples_of(admin_port: int, gid: str) -> int:
    try:
        st = TrainerStatus.model_validate(httpx.get(f"http://127.0.0.1:{admin_port}/status", timeout=2).json())
    except (httpx.HTTPError, ValueError):
        return 0
    g = st.generators.get(gid)
    return g.num_samples if g else 0


def test_a_generator_reconnects_to_a_restarted_trainer_without_restarting(write_job, tiny_model_dir, tmp_path):
    port = free_port()
    job = write_job({"spec": {
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": PROMPTS, "groupSize": GROUP, "maxNewTokens": 48,
                      "microBatchSize": 16},
        "pipeline": {"mode": "stream-sync", "minMicroBatchSize": 4},
        "trainer": {"port": port},
        "generators": {"pools": [{"name": "default", "replicas": 1, "engine": {"type": "torch", "maxBatchSize": 4}}],
                       "reconnect": {"initialBackoffSeconds": 0.2, "maxBackoffSeconds": 1.0}},
    }})
    procs: list[subprocess.Popen] = []

    def trainer(n: int) -> tuple[subprocess.Popen, dict]:
        endpoint = tmp_path / f"trainer-{n}.json"
        proc = _start(["trainer", str(job), "--model-dir", str(tiny_model_dir), "--out", str(tmp_path / f"out-{n}"),
                       "--endpoint-file", str(endpoint)], tmp_path / f"trainer-{n}.log")
        procs.append(proc)
        _wait(endpoint.exists, f"trainer {n} to listen", [proc])
        return proc, json.loads(endpoint.read_text())

    try:
        first, endpoint = trainer(1)
        assert endpoint["grpc_port"] == port
        gen_log, gen_endpoint = tmp_path / "gen-a.log", tmp_path / "gen-a.json"
        gen = _start(["generator", str(job), "--trainer", f"127.0.0.1:{port}", "--id", "gen-a", "--model-dir",
                      str(tiny_model_dir), "--endpoint-file", str(gen_endpoint)], gen_log)
        procs.append(gen)
        # Kill the trainer in its second iteration: the replica holds v1 (stream-sync: the second iteration's
        # work needs it) and work of that iteration.
        per_iteration = PROMPTS * GROUP
        _wait(lambda: _samples_of(endpoint["admin_port"], "gen-a") >= per_iteration + 4, "the second iteration",
              [first, gen])
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        _wait(lambda: gen_log.read_text().count("reconnecting to trainer") >= 2, "two reconnect attempts", [gen],
              timeout_s=30)
        assert gen.poll() is None  # no trainer: it waits, it does not exit
        log = gen_log.read_text()
        assert f"the stream to trainer 127.0.0.1:{port} broke (UNAVAILABLE" in log
        assert "abandoned its work" in log

        second, endpoint2 = trainer(2)
        assert second.wait(timeout=240) == 0, (tmp_path / "trainer-2.log").read_text()[-3000:]
        assert gen.wait(timeout=30) == 0, gen_log.read_text()[-3000:]  # the new trainer's goodbye: a clean exit
        assert json.loads(gen_endpoint.read_text())["pid"] == gen.pid  # the one process served both starts
        log = gen_log.read_text()
        assert log.count("connected to trainer run") == 1 and log.count("reconnected to trainer") == 1
        assert "a new start of the trainer" in log
        assert "v0); this replica holds v1 and fetches the trainer's" in log  # a rollback to the new start's v0
        assert "generator gen-a joined" in (tmp_path / "trainer-2.log").read_text()
        summary = RunSummary.read(tmp_path / "out-2" / "summary.json")
        assert summary.phase == "Succeeded"
        assert summary.num_samples_accepted == ITERATIONS * PROMPTS * GROUP
        records = IterationRecord.read_lines(tmp_path / "out-2" / "metrics.jsonl")
        assert [r.policy_version for r in records] == [1, 2, 3]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _agent_without_its_trainer(tiny_model_dir, reconnect: ReconnectSpec):
    """A generator agent connected to an in-process trainer whose gRPC server is then stopped
    (its streams cut, not closed: no goodbye); returns (agent thread, trainer address)."""
    trainer = TrainerServer(WeightStore(2, 64 * 1024))
    engine = TorchEngine(load_model(tiny_model_dir), 2, eos_token_id=2)
    agent = GeneratorAgent(engine, f"127.0.0.1:{trainer.port}", "g0", "default", ServiceMetrics("generator"),
                           reconnect=reconnect)
    running = AgentThread(agent)
    deadline = time.monotonic() + 30
    while not agent.connected.is_set():
        assert time.monotonic() < deadline, "the agent never connected"
        time.sleep(0.02)
    trainer.call(trainer.server.stop(0))
    trainer.close()
    return running, f"127.0.0.1:{trainer.port}"


def test_a_generator_gives_up_loudly_after_the_give_up_deadline(tiny_model_dir, caplog):
    caplog.set_level(logging.INFO, "streamrl.generator")
    spec = ReconnectSpec(initial_backoff_seconds=0.05, max_backoff_seconds=0.2, give_up_after_seconds=1.5)
    running, address = _agent_without_its_trainer(tiny_model_dir, spec)
    t0 = time.monotonic()
    assert running.done.result(30) == 1
    took = time.monotonic() - t0
    running.close()
    assert 1.0 < took < 10, took
    attempts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reconnecting to trainer")]
    assert len(attempts) >= 5 and all(address in m for m in attempts)  # each attempt said, with its wait and cause
    assert all(" in 0." in m and "cause: " in m for m in attempts)
    gave_up = [r for r in caplog.records if r.getMessage().startswith("giving up")]
    assert len(gave_up) == 1 and gave_up[0].levelname == "ERROR"
    assert f"trainer {address} not reachable again within 1.5s" in gave_up[0].getMessage()


def test_a_draining_generator_does_not_reconnect(tiny_model_dir, caplog):
    caplog.set_level(logging.INFO, "streamrl.generator")
    running, _ = _agent_without_its_trainer(tiny_model_dir, ReconnectSpec(initial_backoff_seconds=0.5))
    deadline = time.monotonic() + 10
    while not any(r.getMessage().startswith("reconnecting") for r in caplog.records):
        assert time.monotonic() < deadline, "no reconnect attempt"
        time.sleep(0.02)
    running.agent.drain("SIGTERM")
    assert running.done.result(5) == 0  # left at once: there was nothing to finish
    running.close()
    attempts = sum(r.getMessage().startswith("reconnecting") for r in caplog.records)
    time.sleep(1.0)
    assert sum(r.getMessage().startswith("reconnecting") for r in caplog.records) == attempts
    assert any("draining (SIGTERM) while reconnecting" in r.getMessage() for r in caplog.records)


def _agent(tiny_model_dir, address: str, reconnect: ReconnectSpec | None = None) -> GeneratorAgent:
    engine = TorchEngine(load_model(tiny_model_dir), 2, eos_token_id=2)
    agent = GeneratorAgent(engine, address, "g0", "default", ServiceMetrics("generator"), reconnect=reconnect)
    agent.wait_log_s = 0.2
    return agent


def test_a_generator_waits_for_a_trainer_not_up_yet_saying_what_it_waits_for(tiny_model_dir, caplog):
    caplog.set_level(logging.INFO, "streamrl.generator")
    port = free_port()
    agent = _agent(tiny_model_dir, f"127.0.0.1:{port}")  # the spec's default: giveUpAfterSeconds unset
    running = AgentThread(agent)
    deadline = time.monotonic() + 30
    said = []
    while len(said) < 5:  # a second and more without a trainer, said every 0.2 s
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not ready: waiting for")]
        assert not running.done.done(), "it exited without its trainer"
        assert time.monotonic() < deadline, "it never said what it waits for"
        time.sleep(0.05)
    assert said[0].startswith(f"not ready: waiting for the trainer at 127.0.0.1:{port} (unreachable for ")
    assert said[0].endswith("(no bound: spec.generators.reconnect.giveUpAfterSeconds is unset)")
    assert agent.waiting_for().startswith(f"the trainer at 127.0.0.1:{port} (unreachable for ")
    assert not agent.connected.is_set()
    trainer = TrainerServer(WeightStore(2, 64 * 1024), port=port)  # the trainer comes up at last
    try:
        deadline = time.monotonic() + 30
        while not agent.connected.is_set():
            assert not running.done.done() and time.monotonic() < deadline, "it never connected"
            time.sleep(0.02)
        assert agent.waiting_for() == ""
        assert running.stop() == 0
    finally:
        trainer.stop()


def test_a_generator_with_a_give_up_bound_exits_1_without_its_trainer_and_one_stopped_while_waiting_0(
        tiny_model_dir, caplog):
    caplog.set_level(logging.INFO, "streamrl.generator")
    address = f"127.0.0.1:{free_port()}"
    bounded = AgentThread(_agent(tiny_model_dir, address, ReconnectSpec(give_up_after_seconds=0.6)))
    assert bounded.done.result(30) == 1
    bounded.close()
    gave_up = [r.getMessage() for r in caplog.records if r.getMessage().startswith("giving up")]
    assert len(gave_up) == 1 and gave_up[0].startswith(f"giving up: trainer {address} unreachable for ")
    assert gave_up[0].endswith("(spec.generators.reconnect.giveUpAfterSeconds 0.6)")
    waiting = AgentThread(_agent(tiny_model_dir, address))
    time.sleep(0.5)
    waiting.agent.drain("SIGTERM")  # the first SIGTERM: it holds nothing, it leaves at once
    assert waiting.done.result(5) == 0
    waiting.close()
    assert any("draining (SIGTERM) while waiting for the trainer" in r.getMessage() for r in caplog.records)
