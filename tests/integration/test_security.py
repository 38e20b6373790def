"""Every gRPC channel authenticates: mutual TLS, or a shared bearer token."""

from __future__ import annotations

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamrl.generator.relay import Relay
from streamrl.messages import WeightsNotice
from streamrl.records import RunSummary
from streamrl.spec import SecuritySpec
from streamrl.v1 import rollout_pb2 as pb
from streamrl.v1 import rollout_pb2_grpc
from streamrl.weights import WeightStore, deserialize
from streamrl.wire.channels import GRPC_OPTIONS, open_channel
from streamrl.wire.transfer import WeightSource, fetch_blob
from tests.integration.certs import TestCA
from tests.integration.inproc import TrainerServer, serve_relay

WEIGHTS = {"w": torch.arange(5000, dtype=torch.float32)}


@pytest.fixture
def ca(tmp_path):
    return TestCA(tmp_path / "ca")


async def _fetch(channel: grpc.aio.Channel, server: TrainerServer) -> dict:
    version = server.store.get(1)
    notice = WeightsNotice(1, version.size_bytes, version.num_chunks, version.sha256)
    return deserialize(await fetch_blob(WeightSource(channel), notice, max_attempts=1))


async def _refused(channel: grpc.aio.Channel, server: TrainerServer) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _fetch(channel, server)
    return err.value


@pytest.fixture
def tls_trainer(ca):
    server = TrainerServer(WeightStore(2, 4096), security=ca.security("trainer"))
    server.store.publish(1, WEIGHTS)
    yield server
    server.stop()


async def test_mutual_tls_peer_with_a_certificate_from_the_job_ca_is_served(ca, tls_trainer):
    async with open_channel(f"127.0.0.1:{tls_trainer.port}", ca.security("gen-0")) as channel:
        assert torch.equal((await _fetch(channel, tls_trainer))["w"], WEIGHTS["w"])


async def test_plaintext_peer_is_refused_by_a_tls_service(tls_trainer):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{tls_trainer.port}", options=GRPC_OPTIONS) as channel:
        assert (await _refused(channel, tls_trainer)).code() == grpc.StatusCode.UNAVAILABLE


async def test_tls_peer_without_a_client_certificate_is_refused(ca, tls_trainer):
    creds = grpc.ssl_channel_credentials(root_certificates=ca.ca_file.read_bytes())
    options = GRPC_OPTIONS + [("grpc.ssl_target_name_override", "streamrl")]
    async with grpc.aio.secure_channel(f"127.0.0.1:{tls_trainer.port}", creds, options=options) as channel:
        assert (await _refused(channel, tls_trainer)).code() == grpc.StatusCode.UNAVAILABLE


async def test_peer_with_a_certificate_from_another_ca_is_refused(tmp_path, ca, tls_trainer):
    rogue = TestCA(tmp_path / "rogue", name="rogue-ca")
    sec = rogue.security("intruder")
    # It trusts the real CA (so it would accept the server) but presents a rogue certificate.
    sec = SecuritySpec(tls=sec.tls.model_copy(update={"ca_file": str(ca.ca_file)}))
    async with open_channel(f"127.0.0.1:{tls_trainer.port}", sec) as channel:
        assert (await _refused(channel, tls_trainer)).code() == grpc.StatusCode.UNAVAILABLE


async def test_bearer_token_is_required_when_tls_is_off(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    server = TrainerServer(WeightStore(2, 4096), security=SecuritySpec(token_file=str(token)))
    server.store.publish(1, WEIGHTS)
    address = f"127.0.0.1:{server.port}"
    try:
        async with grpc.aio.insecure_channel(address, options=GRPC_OPTIONS) as channel:
            err = await _refused(channel, server)
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "missing bearer token" in err.details()
            # Health stays open for probes.
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        wrong = tmp_path / "wrong"
        wrong.write_text("guess")
        async with open_channel(address, SecuritySpec(token_file=str(wrong))) as channel:
            err = await _refused(channel, server)
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "invalid bearer token" in err.details()
        async with open_channel(address, SecuritySpec(token_file=str(token))) as channel:
            assert torch.equal((await _fetch(channel, server))["w"], WEIGHTS["w"])
            # Connect (a bidirectional stream) passes the same check.
            call = rollout_pb2_grpc.RolloutStub(channel).Connect()
            await call.write(pb.ConnectRequest(hello=pb.Hello(generator_id="g", capacity=1)))
            assert (await call.read()).WhichOneof("kind") == "welcome"
            call.cancel()
    finally:
        server.stop()


async def test_relay_applies_the_same_authentication(ca):
    relay = Relay(2, 4096)
    server = await serve_relay(relay, ca.security("gen-1"))
    try:
        version = WeightStore(1, 4096).publish(3, WEIGHTS)
        relay.hold(version)
        notice = WeightsNotice(3, version.size_bytes, version.num_chunks, version.sha256)
        async with open_channel(relay.address, ca.security("gen-2")) as channel:
            got = deserialize(await fetch_blob(WeightSource(channel), notice))
            assert torch.equal(got["w"], WEIGHTS["w"])
        async with grpc.aio.insecure_channel(relay.address, options=GRPC_OPTIONS) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await fetch_blob(WeightSource(channel), notice, max_attempts=1)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(0)


def test_unreadable_tls_file_names_the_field(tmp_path):
    from streamrl.spec import TLSSpec

    sec = SecuritySpec(tls=TLSSpec(ca_file=str(tmp_path / "nope.pem"), cert_file="x", key_file="y"))
    with pytest.raises(ValueError, match=r"security.tls.caFile .*nope.pem: cannot read"):
        open_channel("127.0.0.1:1", sec)


def test_run_with_mutual_tls_and_a_token_end_to_end(ca, tmp_path, write_job, tiny_model_dir):
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
    summary = RunSummary.read(out / "summary.json")
    assert summary.num_samples_accepted == 4 * 4 * 4
    # Each version reached one replica from the trainer and the other from it (relay, over mTLS).
    assert summary.weight_bytes_from_peers > 0 and summary.weight_bytes_from_trainer > 0
    logs = "".join(p.read_text() for p in (out / "logs").glob("generator-*.log"))
    assert "connected to trainer" in logs and "rejected" not in logs


async def test_a_generators_certificate_cannot_pass_for_the_trainer_but_serves_its_pool(ca, tmp_path):
    """Review S2-4: with generatorServerName, a generator's key (e.g. on a node in another
    datacenter) carries only that name: generators dialing the trainer refuse a server showing it,
    while peers fetching from its relay verify exactly it."""
    from streamrl.spec import TLSSpec

    def security(who: str, dns_name: str) -> SecuritySpec:
        cert, key = ca.issue(who, dns_name)
        return SecuritySpec(tls=TLSSpec(ca_file=str(ca.ca_file), cert_file=str(cert), key_file=str(key),
                                        generator_server_name="streamrl-generator"))

    generator = security("gen-0", "streamrl-generator")
    impostor = TrainerServer(WeightStore(2, 4096), security=security("gen-evil", "streamrl-generator"))
    impostor.store.publish(1, WEIGHTS)
    trainer = TrainerServer(WeightStore(2, 4096), security=security("trainer", "streamrl"))
    trainer.store.publish(1, WEIGHTS)
    try:
        async with open_channel(f"127.0.0.1:{impostor.port}", generator) as channel:
            assert (await _refused(channel, impostor)).code() == grpc.StatusCode.UNAVAILABLE
        async with open_channel(f"127.0.0.1:{trainer.port}", generator) as channel:  # its client cert is the job CA's
            assert torch.equal((await _fetch(channel, trainer))["w"], WEIGHTS["w"])
    finally:
        impostor.stop()
        trainer.stop()
    relay = Relay(2, 4096)
    server = await serve_relay(relay, security("gen-1", "streamrl-generator"))
    try:
        version = WeightStore(1, 4096).publish(3, WEIGHTS)
        relay.hold(version)
        notice = WeightsNotice(3, version.size_bytes, version.num_chunks, version.sha256)
        async with open_channel(relay.address, generator, server_name="streamrl-generator") as channel:
            assert torch.equal(deserialize(await fetch_blob(WeightSource(channel), notice))["w"], WEIGHTS["w"])
    finally:
        await server.stop(0)
