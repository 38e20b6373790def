"""The service shell: gRPC health and readiness turn NOT_SERVING the moment a service begins
to leave (a signal), before it stops; a real generator process answers NOT_SERVING while it
drains and still finishes what it holds. A service not ready says in /readyz what it waits for."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from streamrl.service import ExitCode, Service
from tests.conftest import child_env

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def _health(port: int, service: str = "") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                               timeout=5)
        return reply.status


async def test_health_turns_not_serving_when_the_first_signal_arrives_and_the_service_still_answers():
    shell = Service("test", CollectorRegistry(), lambda: {"ok": True})
    shell.start_admin()
    port = await shell.start_grpc(lambda server: None, ("streamrl.v1.Test",), 0)
    assert await _health(port) == NOT_SERVING  # not before it says it serves
    await shell.serving()
    assert await _health(port) == SERVING and await _health(port, "streamrl.v1.Test") == SERVING
    readyz = f"http://127.0.0.1:{shell.admin.port}/readyz"
    assert (await asyncio.to_thread(httpx.get, readyz)).status_code == 200
    signalled = asyncio.Event()
    seen: dict[str, object] = {}

    async def main() -> int:
        await signalled.wait()
        # Leaving, not gone: the server still answers, and says so.
        seen["health"] = await _health(port, "streamrl.v1.Test")
        seen["readyz"] = (await asyncio.to_thread(httpx.get, readyz)).status_code
        return ExitCode.OK

    run = asyncio.ensure_future(shell.run(main(), lambda n: signalled.set()))
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(run, 10) == ExitCode.OK
    assert seen == {"health": NOT_SERVING, "readyz": 503}


async def test_readyz_says_what_a_service_not_ready_waits_for():
    shell = Service("test", CollectorRegistry(), lambda: {"ok": True})
    waiting = ["the trainer at 127.0.0.1:9 (unreachable for 75s)"]
    shell.ready_when = lambda: not waiting
    shell.waiting_for = lambda: waiting[0] if waiting else ""
    shell.start_admin()
    try:
        await shell.serving()
        readyz = f"http://127.0.0.1:{shell.admin.port}/readyz"
        reply = await asyncio.to_thread(httpx.get, readyz)
        assert (reply.status_code, reply.json()) == (503, {"ready": False, "waiting_for": waiting[0]})
        waiting.clear()
        reply = await asyncio.to_thread(httpx.get, readyz)
        assert (reply.status_code, reply.json()) == (200, {"ready": True})
    finally:
        await shell.stop()


def _ipv6_loopback() -> bool:
    """Whether this machine can listen and be reached on ::1."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            return True
    except OSError:
        return False


async def test_a_service_on_any_address_answers_on_ipv4_and_ipv6_loopback():
    """N19: `::` (what the operator's pods listen on) is dual-stack: the admin server and the
    gRPC server answer on 127.0.0.1 as on ::1, so an IPv6-only cluster's probes, Services and
    relay peers reach it as an IPv4 one's do."""
    shell = Service("test", CollectorRegistry(), lambda: {"ok": True}, host="::")
    shell.start_admin()
    try:
        port = await shell.start_grpc(lambda server: None, ("streamrl.v1.Test",), 0)
        await shell.serving()
        hosts = ["127.0.0.1", *(["[::1]"] if _ipv6_loopback() else [])]
        for host in hosts:
            reply = await asyncio.to_thread(httpx.get, f"http://{host}:{shell.admin.port}/healthz", timeout=5)
            assert reply.json() == {"ok": True}, host
            async with grpc.aio.insecure_channel(f"{host}:{port}") as channel:
                health = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="streamrl.v1.Test"), timeout=5)
            assert health.status == SERVING, host
    finally:
        await shell.stop()


def _wait(cond, what: str, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while not (value := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrl.cli", *argv], env=child_env(),
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def test_a_draining_generator_answers_not_serving_and_finishes_what_it_holds(tmp_path, write_job, tiny_model_dir):
    job = write_job({"spec": {
        "model": {"source": "path", "path": str(tiny_model_dir)},
        "algorithm": {"numIterations": 2, "promptsPerStep": 8, "groupSize": 4, "maxNewTokens": 200},
        "generators": {"pools": [{"name": "default", "replicas": 1, "engine": {"type": "torch", "maxBatchSize": 2}}]},
    }})
    out = tmp_path / "out"
    trainer = _start(["trainer", str(job), "--model-dir", str(tiny_model_dir), "--out", str(out),
                      "--endpoint-file", str(tmp_path / "trainer.json")], tmp_path / "trainer.log")
    procs = [trainer]
    try:
        t = _wait(lambda: (tmp_path / "trainer.json").exists() and json.loads((tmp_path / "trainer.json").read_text()),
                  "the trainer's endpoint")
        gen = _start(["generator", str(job), "--trainer", f"127.0.0.1:{t['grpc_port']}", "--id", "g0",
                      "--model-dir", str(tiny_model_dir), "--endpoint-file", str(tmp_path / "g0.json")],
                     tmp_path / "g0.log")
        procs.append(gen)
        g = _wait(lambda: (tmp_path / "g0.json").exists() and json.loads((tmp_path / "g0.json").read_text()),
                  "the generator's endpoint")
        status = f"http://127.0.0.1:{g['admin_port']}/status"
        _wait(lambda: httpx.get(status, timeout=2).json().get("num_running", 0) > 0, "the generator to hold work")
        assert asyncio.run(_health(g["grpc_port"])) == SERVING
        gen.send_signal(signal.SIGTERM)
        states = []
        while gen.poll() is None:
            try:
                states.append(asyncio.run(_health(g["grpc_port"])))
            except grpc.aio.AioRpcError:
                break  # its server has stopped: the drain is over
            time.sleep(0.05)
        # NOT_SERVING for the whole drain (a check racing the signal may still see SERVING, never after).
        assert NOT_SERVING in states and SERVING not in states[states.index(NOT_SERVING):]
        assert gen.wait(60) == 0
        log = (tmp_path / "g0.log").read_text()
        assert "drained: the trainer has every sample this replica held" in log
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
