"""The ranker as a real process on loopback: learn over gRPC, rank, survive a restart."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest

from streamrl.ranker.ranker import recall_at
from streamrl.tasks import counting_prompts
from streamrl.v1 import ranker_pb2 as pb
from streamrl.v1 import ranker_pb2_grpc
from streamrl.wire.channels import GRPC_OPTIONS
from tests.conftest import EXAMPLE, child_env


def _start(tmp_path: Path, state: Path) -> tuple[subprocess.Popen, dict]:
    endpoint = tmp_path / f"ranker-{time.monotonic_ns()}.json"
    proc = subprocess.Popen([sys.executable, "-m", "streamrl.cli", "ranker", str(EXAMPLE), "--state", str(state),
                             "--endpoint-file", str(endpoint)], env=child_env(),
                            stdout=(tmp_path / "ranker.log").open("a"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not endpoint.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "ranker.log").read_text()
        time.sleep(0.05)
    return proc, json.loads(endpoint.read_text())


def _prompt(p, prefix: str) -> pb.RankedPrompt:
    return pb.RankedPrompt(prompt_key=f"{prefix}{p.index}", text=p.text)


def test_ranker_service_learns_online_ranks_and_survives_a_restart(tmp_path):
    state = tmp_path / "ranker.npz"
    proc, ep = _start(tmp_path, state)
    held = counting_prompts(300, seed=9)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ep['grpc_port']}", options=GRPC_OPTIONS) as ch:
            stub = ranker_pb2_grpc.RankerStub(ch)
            reply = stub.Observe(pb.ObserveRequest(prompt=_prompt(p, "train-"), policy_version=0,
                                                   lengths=[len(p.answer) + 1] * 2)
                                 for p in counting_prompts(800, seed=8))
            assert reply.num_observed == 800
            ranked = stub.Rank(pb.RankRequest(prompts=[_prompt(p, "held-") for p in held])).predictions
            with pytest.raises(grpc.RpcError) as err:
                stub.Rank(pb.RankRequest(prompts=[pb.RankedPrompt()]))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        pairs = [(r.predicted_length, len(p.answer) + 1) for r, p in zip(ranked, held)]
        assert recall_at(pairs, 0.2) >= 0.85
        assert sorted(r.rank for r in ranked) == list(range(len(held)))
        metrics = httpx.get(f"http://127.0.0.1:{ep['admin_port']}/metrics").text
        assert 'streamrl_ranker_recall{top="0.20"}' in metrics
        assert "streamrl_ranker_observations_total 800.0" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert state.is_file()
    proc, ep = _start(tmp_path, state)
    try:
        assert httpx.get(f"http://127.0.0.1:{ep['admin_port']}/status").json()["num_observed"] == 800
        with grpc.insecure_channel(f"127.0.0.1:{ep['grpc_port']}", options=GRPC_OPTIONS) as ch:
            again = ranker_pb2_grpc.RankerStub(ch).Rank(pb.RankRequest(prompts=[_prompt(p, "held-") for p in held]))
        assert [r.predicted_length for r in again.predictions] == pytest.approx([r.predicted_length for r in ranked])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
