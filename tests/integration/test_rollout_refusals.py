"""How the trainer's Rollout service meets bad input on real loopback gRPC: a bad sample is
refused while its stream goes on; a broken stream (protocol, size, bytes, a generator sending
only garbage) ends with its status, and its work goes to the other generators."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamrl.rollout.refusals import MAX_MALFORMED_IN_A_ROW
from streamrl.rollout.work import PromptWork
from streamrl.v1 import rollout_pb2 as pb
from streamrl.weights import WeightStore
from tests.integration.connect_client import ConnectStream, hello, open_insecure
from tests.integration.inproc import TrainerServer

VOCAB = 32


@pytest.fixture
def server():
    s = TrainerServer(WeightStore(keep=2, chunk_bytes=4096), vocab_size=VOCAB)
    s.on_loop(lambda: s.coordinator.add_prompts(0, [PromptWork("p0", 0, "7", (1, 5))], group_size=2,
                                                min_policy_version=0))
    yield s
    s.stop()


@pytest.fixture
def channel(server):
    ch = open_insecure(server.port)
    yield ch
    ch.close()


def _sample(index: int, logprobs=(-0.5, -0.25), tokens=(7, 2), prompt_id="p0") -> pb.ConnectRequest:
    return pb.ConnectRequest(sample=pb.Sample(prompt_id=prompt_id, sample_index=index, completion_token_ids=tokens,
                                              logprobs=logprobs, finish_reason=pb.FINISH_REASON_STOP))


def _refused(server: TrainerServer) -> dict[str, int]:
    return server.on_loop(lambda: dict(server.coordinator.counters.num_samples_refused))


def _wait_for(server: TrainerServer, what: str, check, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (result := server.on_loop(check)):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s}s for {what}")
        time.sleep(0.01)
    return result


def _connect(channel, generator_id: str, capacity: int = 4) -> ConnectStream:
    stream = ConnectStream(channel)
    stream.send(hello(generator_id, capacity))
    stream.next("welcome")
    return stream


def test_a_bad_sample_is_refused_and_generated_again_while_the_stream_goes_on(server, channel):
    g = _connect(channel, "g")
    assert list(g.next("assign").assign.sample_indices) == [0, 1]
    g.send(_sample(0, logprobs=(float("nan"), -0.25)))
    again = g.next("assign").assign  # the trainer asks again, on the same stream
    assert (again.prompt_id, list(again.sample_indices)) == ("p0", [0])
    assert _refused(server) == {"bad_logprob": 1}
    g.send(_sample(0))
    g.send(_sample(1))
    _wait_for(server, "both samples accepted", lambda: server.coordinator.counters.num_samples_accepted == 2)
    assert server.num_connected() == 1
    assert g.close() is None


@pytest.mark.parametrize(("message", "reason"), [
    (pb.ConnectRequest(sample=pb.Sample(prompt_id="x" * (2 << 20))).SerializeToString(), "oversized"),
    (b"\x12\x05ab", "undecodable"),  # a sample 5 bytes long, cut after 2
    (b"", "empty_message"),
    (hello("g").SerializeToString(), "hello_again"),
], ids=["oversized", "undecodable", "empty_message", "hello_again"])
def test_a_message_that_breaks_the_stream_ends_only_that_stream_and_its_work_goes_elsewhere(
        server, channel, message, reason):
    a = _connect(channel, "a")
    assert a.next("assign").assign.prompt_id == "p0"
    b = _connect(channel, "b")
    a.send(message)
    err = a.end()
    assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(f"{reason}: ")
    assert list(b.next("assign").assign.sample_indices) == [0, 1]  # a's work, re-dispatched
    assert _refused(server) == {reason: 1}
    assert server.num_connected() == 1
    assert b.close() is None


def test_a_generator_sending_only_malformed_samples_is_cut_off(server, channel):
    a = _connect(channel, "a")
    a.next("assign")
    b = _connect(channel, "b")
    for _ in range(MAX_MALFORMED_IN_A_ROW):
        a.send(_sample(0, tokens=(7, VOCAB)))  # outside the vocabulary
    err = a.end()
    assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"sent {MAX_MALFORMED_IN_A_ROW} malformed samples in a row, the last token_out_of_vocab" in err.details()
    assert _refused(server) == {"token_out_of_vocab": MAX_MALFORMED_IN_A_ROW}
    # the refused sample a held is asked of b at once (b has the most room), the rest once a is gone
    work = [b.next("assign").assign for _ in range(2)]
    assert [list(w.sample_indices) for w in work] == [[0], [1]]
    assert b.close() is None


@pytest.mark.parametrize(("first", "code", "reason"), [
    (_sample(0), grpc.StatusCode.INVALID_ARGUMENT, "not_hello"),
    (pb.ConnectRequest(load=pb.LoadReport()), grpc.StatusCode.INVALID_ARGUMENT, "not_hello"),
    (pb.ConnectRequest(hello=pb.Hello(generator_id="", capacity=2)), grpc.StatusCode.INVALID_ARGUMENT, "bad_hello"),
    (pb.ConnectRequest(hello=pb.Hello(generator_id="z", capacity=0)), grpc.StatusCode.INVALID_ARGUMENT, "bad_hello"),
    (hello("taken"), grpc.StatusCode.ALREADY_EXISTS, "generator_id_taken"),
], ids=["sample_first", "load_first", "empty_id", "zero_capacity", "id_taken"])
def test_a_stream_that_does_not_start_with_a_good_hello_is_refused_and_counted(server, channel, first, code, reason):
    taken = _connect(channel, "taken")
    stream = ConnectStream(channel)
    stream.send(first)
    err = stream.end()
    assert err is not None and err.code() == code and err.details().startswith(f"{reason}: ")
    assert _refused(server) == {reason: 1}
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert server.num_connected() == 1
    assert taken.close() is None
