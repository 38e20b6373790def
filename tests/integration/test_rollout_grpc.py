"""The Rollout service's gRPC edge over a real loopback server: status codes and weight transfer."""

from __future__ import annotations

import grpc
import pytest
import torch

from streamrl.messages import WeightsNotice
from streamrl.v1 import rollout_pb2 as pb
from streamrl.v1 import rollout_pb2_grpc
from streamrl.weights import WeightsCorruptError, WeightStore, deserialize
from streamrl.wire.channels import GRPC_OPTIONS
from tests.integration.inproc import TrainerServer, fetch


@pytest.fixture
def server():
    store = WeightStore(keep=2, chunk_bytes=4096)
    s = TrainerServer(store)
    yield s
    s.stop()


@pytest.fixture
def stub(server):
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}", options=GRPC_OPTIONS)
    yield rollout_pb2_grpc.RolloutStub(channel)
    channel.close()


def _weights():
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(200, 100, generator=g), "b": torch.randn(100, generator=g)}


def _notice(version) -> WeightsNotice:
    return WeightsNotice(version.policy_version, version.size_bytes, version.num_chunks, version.sha256)


def test_connect_must_start_with_hello(stub):
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Connect(iter([pb.ConnectRequest(load=pb.LoadReport())])))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be a Hello" in err.value.details()


def test_second_connection_with_the_same_id_is_refused(stub, server):
    import queue

    q: queue.Queue = queue.Queue()
    q.put(pb.ConnectRequest(hello=pb.Hello(generator_id="g1", pool="p", capacity=2, engine="torch")))
    first = stub.Connect(iter(q.get, None))
    assert next(first).WhichOneof("kind") == "welcome"
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Connect(iter([pb.ConnectRequest(hello=pb.Hello(generator_id="g1", capacity=2))])))
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Connect(iter([pb.ConnectRequest(hello=pb.Hello(generator_id="g2", capacity=0))])))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    q.put(None)
    first.cancel()


def test_weights_round_trip_over_grpc_in_chunks(server):
    version = server.store.publish(1, _weights())
    assert version.num_chunks > 10
    got = deserialize(fetch(f"127.0.0.1:{server.port}", _notice(version)))
    for k, v in _weights().items():
        assert torch.equal(got[k], v)


def test_unknown_version_and_bad_offset_have_clear_status(stub, server):
    server.store.publish(1, _weights())
    with pytest.raises(grpc.RpcError) as err:
        list(stub.FetchWeights(pb.FetchWeightsRequest(policy_version=9)))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as err:
        list(stub.FetchWeights(pb.FetchWeightsRequest(policy_version=1, offset_bytes=7)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_corrupted_version_is_rejected(server):
    version = server.store.publish(3, _weights())
    wrong = WeightsNotice(3, version.size_bytes, version.num_chunks, "0" * 64)
    with pytest.raises(WeightsCorruptError, match="whole-version checksum"):
        fetch(f"127.0.0.1:{server.port}", wrong)


def test_a_message_the_trainer_cannot_take_ends_the_stream_with_the_reason(stub, server):
    """A failure reading a replica's stream is never swallowed: the replica gets the status
    and the reason, and its work goes back to the queue."""
    import queue

    q: queue.Queue = queue.Queue()
    q.put(pb.ConnectRequest(hello=pb.Hello(generator_id="g1", pool="p", capacity=2, engine="torch")))
    responses = stub.Connect(iter(q.get, None))
    assert next(responses).WhichOneof("kind") == "welcome"
    q.put(pb.ConnectRequest(hello=pb.Hello(generator_id="g1", capacity=2)))  # a second Hello mid-stream
    with pytest.raises(grpc.RpcError) as err:
        list(responses)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Hello" in err.value.details()
    q.put(None)
    assert server.num_connected() == 0
