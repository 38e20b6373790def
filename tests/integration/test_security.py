"""Every gRPC channel authenticates: mutual TLS, or a shared bearer token."""

from __future__ import annotations

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamrl.samples import WeightsNotice
from streamrl.security import open_channel
from streamrl.spec import SecuritySpec
from streamrl.transfer import RelayServer, fetch_blob
from streamrl.v1 import rollout_pb2 as pb
from streamrl.v1 import rollout_pb2_grpc
from streamrl.weights import WeightStore, deserialize
from streamrl.wire import GRPC_OPTIONS
from tests.integration.certs import TestCA
from tests.integration.inproc import TrainerServer

WEIGHTS = {"w": torch.arange(5000, dtype=torch.float32)}


@pytest.fixture
def ca(tmp_path):
    return TestCA(tmp_path / "ca")


def _fetch(channel: grpc.Channel, server: TrainerServer) -> dict:
    version = server.store.get(1)
    notice = WeightsNotice(1, version.size_bytes, version.num_chunks, version.sha256)
    return deserialize(fetch_blob(rollout_pb2_grpc.RolloutStub(channel), notice, max_attempts=1))


def _refused(channel: grpc.Channel, server: TrainerServer) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        _fetch(channel, server)
    return err.value


@pytest.fixture
def tls_trainer(ca):
    server = TrainerServer(WeightStore(2, 4096), security=ca.security("trainer"))
    server.store.publish(1, WEIGHTS)
    yield server
    server.stop()


def test_mutual_tls_peer_with_a_certificate_from_the_job_ca_is_served(ca, tls_trainer):
    with open_channel(f"127.0.0.1:{tls_trainer.port}", ca.security("gen-0")) as channel:
        assert torch.equal(_fetch(channel, tls_trainer)["w"], WEIGHTS["w"])


def test_plaintext_peer_is_refused_by_a_tls_service(tls_trainer):
    with grpc.insecure_channel(f"127.0.0.1:{tls_trainer.port}", options=GRPC_OPTIONS) as channel:
        assert _refused(channel, tls_trainer).code() == grpc.StatusCode.UNAVAILABLE


def test_tls_peer_without_a_client_certificate_is_refused(ca, tls_trainer):
    creds = grpc.ssl_channel_credentials(root_certificates=ca.ca_file.read_bytes())
    options = GRPC_OPTIONS + [("grpc.ssl_target_name_override", "streamrl")]
    with grpc.secure_channel(f"127.0.0.1:{tls_trainer.port}", creds, options=options) as channel:
        assert _refused(channel, tls_trainer).code() == grpc.StatusCode.UNAVAILABLE


def test_peer_with_a_certificate_from_another_ca_is_refused(tmp_path, ca, tls_trainer):
    rogue = TestCA(tmp_path / "rogue", name="rogue-ca")
    sec = rogue.security("intruder")
    # It trusts the real CA (so it would accept the server) but presents a rogue certificate.
    sec = SecuritySpec(tls=sec.tls.model_copy(update={"ca_file": str(ca.ca_file)}))
    with open_channel(f"127.0.0.1:{tls_trainer.port}", sec) as channel:
        assert _refused(channel, tls_trainer).code() == grpc.StatusCode.UNAVAILABLE


def test_bearer_token_is_required_when_tls_is_off(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    server = TrainerServer(WeightStore(2, 4096), security=SecuritySpec(token_file=str(token)))
    server.store.publish(1, WEIGHTS)
    address = f"127.0.0.1:{server.port}"
    try:
        with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
            err = _refused(channel, server)
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "missing bearer token" in err.details()
            # Health stays open for probes.
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        wrong = tmp_path / "wrong"
        wrong.write_text("guess")
        with open_channel(address, SecuritySpec(token_file=str(wrong))) as channel:
            err = _refused(channel, server)
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "invalid bearer token" in err.details()
        with open_channel(address, SecuritySpec(token_file=str(token))) as channel:
            assert torch.equal(_fetch(channel, server)["w"], WEIGHTS["w"])
            # Connect (a bidirectional stream) passes the same check.
            responses = rollout_pb2_grpc.RolloutStub(channel).Connect(
                iter([pb.ConnectRequest(hello=pb.Hello(generator_id="g", capacity=1))]))
            assert next(responses).WhichOneof("kind") == "welcome"
            responses.cancel()
    finally:
        server.stop()


def test_relay_server_applies_the_same_authentication(ca):
    relay = RelayServer(2, 4096, security=ca.security("gen-1")).start()
    try:
        blob_version = WeightStore(1, 4096).publish(3, WEIGHTS)
        relay.hold(3, blob_version.blob)
        notice = WeightsNotice(3, blob_version.size_bytes, blob_version.num_chunks, blob_version.sha256)
        with open_channel(relay.address, ca.security("gen-2")) as channel:
            got = deserialize(fetch_blob(rollout_pb2_grpc.RolloutStub(channel), notice))
            assert torch.equal(got["w"], WEIGHTS["w"])
        with grpc.insecure_channel(relay.address, options=GRPC_OPTIONS) as channel:
            with pytest.raises(grpc.RpcError) as err:
                fetch_blob(rollout_pb2_grpc.RolloutStub(channel), notice, max_attempts=1)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        relay.stop()


def test_unreadable_tls_file_names_the_field(tmp_path):
    from streamrl.spec import TLSSpec

    sec = SecuritySpec(tls=TLSSpec(ca_file=str(tmp_path / "nope.pem"), cert_file="x", key_file="y"))
    with pytest.raises(ValueError, match=r"security.tls.caFile .*nope.pem: cannot read"):
        open_channel("127.0.0.1:1", sec)


def test_run_with_mutual_tls_and_a_token_end_to_end(ca, tmp_path, write_job, tiny_model_dir):
    import json
    import subprocess
    import sys

    from tests.conftest import child_env

    cert, key = ca.issue("job")
    token = tmp_path / "token"
    token.write_text("t0ken")
    job = write_job({"spec": {
        "model": {"source": "path", "path": str(tiny_model_dir)},
        "algorithm": {"numIterations": 4, "promptsPerStep": 4, "groupSize": 4, "maxNewTokens": 16},
        "trainer": {"minGenerators": 2},
        "pipeline": {"mode": "stream-async"},
        "generators": {"pools": [{"name": "default", "replicas": 2}]},
        "security": {"tls": {"caFile": str(ca.ca_file), "certFile": str(cert), "keyFile": str(key)},
                     "tokenFile": str(token)},
    }})
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_samples_accepted"] == 4 * 4 * 4
    # Each version reached one replica from the trainer and the other from it (relay, over mTLS).
    assert summary["weight_bytes_from_peers"] > 0 and summary["weight_bytes_from_trainer"] > 0
    logs = "".join(p.read_text() for p in (out / "logs").glob("generator-*.log"))
    assert "connected to trainer" in logs and "rejected" not in logs
