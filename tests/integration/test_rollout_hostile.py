"""Property-based (Hypothesis): malformed and hostile Connect messages, generated, sent to a
real trainer gRPC server on loopback. Every one is refused with its reason counted once,
nothing of it is accepted, and afterwards the trainer still answers: health SERVING, and a
valid generator connects and its samples are accepted (and only they reach the groups)."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrl.messages import WeightsNotice
from streamrl.rollout.refusals import MALFORMED, REQUEST_BASE_BYTES, REQUEST_BYTES_PER_TOKEN, Refusal
from streamrl.rollout.work import PromptWork
from streamrl.v1 import rollout_pb2 as pb
from streamrl.weights import WeightStore
from tests.integration.connect_client import ConnectStream, hello, open_insecure
from tests.integration.inproc import TrainerServer

VOCAB = 64
MAX_NEW_TOKENS = 8  # TrainerServer's sampling
GROUP = 4
PUBLISHED = 2
"""The trainer announced v2; prompt `late` (iteration 3) takes v2 only, `known` (iteration 0) any."""
ISSUED = {"known", "late"}
LIMIT = REQUEST_BASE_BYTES + REQUEST_BYTES_PER_TOKEN * MAX_NEW_TOKENS
HYPOTHESIS = settings(max_examples=100, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_ids = itertools.count()


@dataclass(frozen=True)
class Case:
    """What a hostile generator sends, and what the trainer must answer."""

    messages: tuple[bytes, ...]
    reason: Refusal | frozenset[Refusal]
    """The one counted refusal (or any of these, when several faults are mixed)."""
    after_hello: bool = True
    """Sent on a stream opened with a valid Hello (else they open it)."""
    code: grpc.StatusCode | None = None
    """How the stream ends (None: it goes on)."""


# ---- a valid sample, then one fault -------------------------------------------------------

@st.composite
def valid_samples(draw) -> pb.Sample:
    """A sample of `known` the trainer would accept (indices 1-3 are never sent valid)."""
    n = draw(st.integers(1, MAX_NEW_TOKENS))
    return pb.Sample(prompt_id="known", sample_index=draw(st.integers(1, GROUP - 1)),
                     completion_token_ids=draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n)),
                     logprobs=draw(st.lists(st.floats(-30.0, 0.0, width=32), min_size=n, max_size=n)),
                     policy_version=draw(st.integers(0, PUBLISHED)),
                     finish_reason=draw(st.sampled_from([pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH])))


SAMPLE_FAULTS = [Refusal.PREVIOUS_INCARNATION, Refusal.DUPLICATE, Refusal.UNKNOWN_PROMPT, Refusal.INDEX_OUT_OF_RANGE,
                 Refusal.FINISH_REASON, Refusal.EMPTY_COMPLETION, Refusal.TOO_LONG, Refusal.LOGPROBS_MISMATCH,
                 Refusal.TOKEN_OUT_OF_VOCAB, Refusal.BAD_LOGPROB, Refusal.FUTURE_VERSION, Refusal.STALE]


def _put(draw, values, value) -> None:
    """Put value at a drawn position of values (appended to an empty list)."""
    if values:
        values[draw(st.integers(0, len(values) - 1))] = value
    else:
        values.append(value)


@st.composite
def faults(draw, s: pb.Sample) -> Refusal:
    """Make `s` wrong in one way; which refusal that must bring."""
    reason = draw(st.sampled_from(SAMPLE_FAULTS))
    tokens, logprobs = s.completion_token_ids, s.logprobs
    match reason:
        case Refusal.PREVIOUS_INCARNATION:
            s.incarnation = draw(st.integers(1, 2**32 - 1))
        case Refusal.DUPLICATE:
            s.prompt_id, s.sample_index = draw(st.sampled_from([("known", 0), ("late", 0)]))
            s.policy_version = PUBLISHED
        case Refusal.UNKNOWN_PROMPT:
            s.prompt_id = draw(st.text(max_size=40).filter(lambda t: t not in ISSUED))
        case Refusal.INDEX_OUT_OF_RANGE:
            s.sample_index = draw(st.integers(GROUP, 2**32 - 1))
        case Refusal.FINISH_REASON:
            s.finish_reason = draw(st.sampled_from([pb.FINISH_REASON_UNSPECIFIED]) | st.integers(3, 2**31 - 1))
        case Refusal.EMPTY_COMPLETION:
            del tokens[:], logprobs[:]
        case Refusal.TOO_LONG:
            n = draw(st.integers(MAX_NEW_TOKENS + 1, 4 * MAX_NEW_TOKENS))
            tokens.extend([3] * (n - len(tokens)))
            logprobs.extend([-1.0] * (n - len(logprobs)))
        case Refusal.LOGPROBS_MISMATCH:
            n = draw(st.integers(0, MAX_NEW_TOKENS + 3).filter(lambda k: k != len(tokens)))
            del logprobs[n:]
            logprobs.extend([-1.0] * (n - len(logprobs)))
        case Refusal.TOKEN_OUT_OF_VOCAB:
            _put(draw, tokens, draw(st.integers(VOCAB, 2**32 - 1)))
        case Refusal.BAD_LOGPROB:
            bad = st.sampled_from([math.nan, math.inf, -math.inf]) | st.floats(2.0**-6, 2.0**100, width=32)
            _put(draw, logprobs, draw(bad))
        case Refusal.FUTURE_VERSION:
            s.policy_version = draw(st.integers(PUBLISHED + 1, 2**64 - 1))
        case Refusal.STALE:
            s.prompt_id, s.policy_version = "late", draw(st.integers(0, PUBLISHED - 1))
    return reason


@st.composite
def bad_samples(draw) -> Case:
    s = draw(valid_samples())
    reason = draw(faults(s))
    return Case((pb.ConnectRequest(sample=s).SerializeToString(),), reason)


@st.composite
def mixed_bad_samples(draw) -> Case:
    """Several faults in one sample: one refusal, for one of them or one they bring about
    together (a token added past the log-probs, say)."""
    s = draw(valid_samples())
    reasons = frozenset(draw(faults(s)) for _ in range(draw(st.integers(2, 4))))
    return Case((pb.ConnectRequest(sample=s).SerializeToString(),), reasons | MALFORMED)


# ---- reports the trainer cannot use (ignored), messages that end the stream -----------------

_not_usable = st.sampled_from([math.nan, math.inf, -math.inf]) | st.floats(max_value=-2.0**-10, width=32)


@st.composite
def bad_profiles(draw) -> list[pb.LatencyPoint]:
    """A PTL(BS) the long-tail planner cannot use: a batch size repeated, out of order or 0,
    or seconds that are not finite and >= 0."""
    sizes = sorted(draw(st.sets(st.integers(1, 4096), min_size=1, max_size=6)))
    seconds = draw(st.lists(st.floats(0.0, 10.0, width=32), min_size=len(sizes), max_size=len(sizes)))
    i = draw(st.integers(0, len(sizes) - 1))
    match draw(st.sampled_from(["repeat", "reverse", "zero", "seconds"])):
        case "repeat":
            sizes.insert(i, sizes[i])
            seconds.insert(i, 0.5)
        case "reverse" if len(sizes) > 1:
            sizes.reverse()
        case "seconds":
            seconds[i] = draw(_not_usable)
        case _:
            sizes[0] = 0
    return [pb.LatencyPoint(batch_size=b, seconds_per_step=t) for b, t in zip(sizes, seconds)]


@st.composite
def bad_reports(draw) -> Case:
    kind = draw(st.sampled_from(["numbers", "profile", "version", "sync_s"]))
    if kind in ("numbers", "profile"):
        load = pb.LoadReport(num_running=draw(st.integers(0, 2**32 - 1)), tokens_per_s=12.5, skewness_bubble_s=0.5)
        if kind == "profile":
            load.latency_profile.extend(draw(bad_profiles()))
        else:
            setattr(load, draw(st.sampled_from(["tokens_per_s", "skewness_bubble_s"])), draw(_not_usable))
        return Case((pb.ConnectRequest(load=load).SerializeToString(),), Refusal.BAD_LOAD_REPORT)
    loaded = pb.WeightsLoaded(policy_version=PUBLISHED, sync_s=0.25, source="trainer")
    if kind == "version":
        loaded.policy_version = draw(st.integers(PUBLISHED + 1, 2**64 - 1))
    else:
        loaded.sync_s = draw(_not_usable)
    return Case((pb.ConnectRequest(weights_loaded=loaded).SerializeToString(),), Refusal.BAD_WEIGHTS_LOADED)


def _varint(n: int) -> bytes:
    out = b""
    while n > 0x7F:
        out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
    return out + bytes([n])


@st.composite
def stream_breakers(draw) -> Case:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    kind = draw(st.sampled_from(["not_hello", "bad_hello", "bad_profile", "taken", "hello_again", "empty",
                                 "unknown_field", "undecodable", "oversized"]))
    if kind == "not_hello":
        first = draw(st.sampled_from([
            pb.ConnectRequest(sample=draw(valid_samples())), pb.ConnectRequest(load=pb.LoadReport(num_running=3)),
            pb.ConnectRequest(draining=pb.Draining(reason=draw(st.text(max_size=20)))),
            pb.ConnectRequest(weights_loaded=pb.WeightsLoaded(policy_version=1))]))
        return Case((first.SerializeToString(),), Refusal.NOT_HELLO, False, invalid)
    if kind == "bad_hello":
        generator_id, capacity = draw(st.sampled_from([("", st.integers(0, 2**32 - 1)), ("x", st.just(0))]))
        m = pb.ConnectRequest(hello=pb.Hello(generator_id=generator_id, capacity=draw(capacity)))
        return Case((m.SerializeToString(),), Refusal.BAD_HELLO, False, invalid)
    if kind == "bad_profile":
        m = hello(draw(st.text(min_size=1, max_size=20)).replace("good", "g00d"))
        m.hello.latency_profile.extend(draw(bad_profiles()))
        return Case((m.SerializeToString(),), Refusal.BAD_HELLO, False, invalid)
    if kind == "taken":
        return Case((hello("good").SerializeToString(),), Refusal.GENERATOR_ID_TAKEN, False,
                    grpc.StatusCode.ALREADY_EXISTS)
    if kind == "hello_again":
        return Case((hello(draw(st.text(min_size=1, max_size=20))).SerializeToString(),), Refusal.HELLO_AGAIN,
                    True, invalid)
    if kind == "empty":
        return Case((b"",), Refusal.EMPTY_MESSAGE, draw(st.booleans()), invalid)
    if kind == "unknown_field":  # a varint field no ConnectRequest has (a newer generator's message, say)
        message = _varint(draw(st.integers(6, 1000)) << 3) + _varint(draw(st.integers(0, 2**63)))
        return Case((message,), Refusal.EMPTY_MESSAGE, draw(st.booleans()), invalid)
    if kind == "undecodable":  # a length-delimited sample cut short
        length = draw(st.integers(1, 4096))
        body = draw(st.binary(max_size=length - 1))
        return Case((b"\x12" + _varint(length) + body,), Refusal.UNDECODABLE, draw(st.booleans()),
                    invalid)
    size = draw(st.integers(LIMIT + 1, LIMIT + 100_000))
    m = pb.ConnectRequest(sample=pb.Sample(prompt_id="x" * size))
    return Case((m.SerializeToString(),), Refusal.OVERSIZED, draw(st.booleans()), invalid)


# ---- the trainer ---------------------------------------------------------------------------

@dataclass
class Trainer:
    server: TrainerServer
    channel: grpc.Channel
    good: ConnectStream
    """A healthy generator holding every sample (so hostile ones are assigned nothing)."""

    def counts(self) -> tuple[dict[str, int], int]:
        c = self.server.coordinator.counters
        return self.server.on_loop(lambda: (dict(c.num_samples_refused), c.num_samples_accepted))


def _sample(prompt_id: str, index: int, policy_version: int) -> pb.ConnectRequest:
    return pb.ConnectRequest(sample=pb.Sample(prompt_id=prompt_id, sample_index=index, completion_token_ids=[5, 2],
                                              logprobs=[-0.5, -0.5], policy_version=policy_version,
                                              finish_reason=pb.FINISH_REASON_STOP))


def _wait(trainer: Trainer, what: str, check, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (result := trainer.server.on_loop(check)):
        assert time.monotonic() < deadline, f"waited {timeout_s}s for {what}"
        time.sleep(0.005)
    return result


@pytest.fixture
def trainer():
    server = TrainerServer(WeightStore(keep=2, chunk_bytes=4096), vocab_size=VOCAB)
    c = server.coordinator

    def setup():
        c.announce(WeightsNotice(PUBLISHED, 1, 1, "00"))
        c.add_prompts(0, [PromptWork("known", 0, "7", (1, 5))], GROUP, min_policy_version=0)
        c.add_prompts(3, [PromptWork("late", 1, "7", (1, 6))], GROUP, min_policy_version=PUBLISHED)

    server.on_loop(setup)
    channel = open_insecure(server.port)
    good = ConnectStream(channel)
    good.send(hello("good", capacity=16))
    good.next("welcome")
    assert good.next("new_weights").new_weights.policy_version == PUBLISHED  # a late joiner hears of v2 first
    assert {good.next("assign").assign.prompt_id for _ in range(2)} == ISSUED
    good.send(_sample("known", 0, 0))
    good.send(_sample("late", 0, PUBLISHED))
    t = Trainer(server, channel, good)
    _wait(t, "the good generator's first samples", lambda: c.counters.num_samples_accepted == 2)
    yield t
    channel.close()
    server.stop()


def _play(trainer: Trainer, case: Case) -> None:
    """Send a case on a fresh stream; the refusal must be counted once, nothing accepted."""
    before, accepted = trainer.counts()
    stream = ConnectStream(trainer.channel)
    gid = f"hostile-{next(_ids)}"
    if case.after_hello:
        stream.send(hello(gid, capacity=1))
        stream.next("welcome")
    for message in case.messages:
        stream.send(message)
    if case.code is not None:
        err = stream.end()
        assert err is not None and err.code() == case.code, err
    else:  # refused, and the stream goes on: the replica is still connected once it is counted
        _wait(trainer, f"a refusal for {case.reason}",
              lambda: sum(trainer.server.coordinator.counters.num_samples_refused.values()) > sum(before.values()))
        assert trainer.server.on_loop(lambda: gid in trainer.server.coordinator.replicas)
        assert stream.close() is None
    after, accepted_after = trainer.counts()
    grew = {r: n - before.get(r, 0) for r, n in after.items() if n != before.get(r, 0)}
    assert len(grew) == 1 and list(grew.values()) == [1], grew
    [reason] = grew
    expected = case.reason if isinstance(case.reason, frozenset) else {case.reason}
    assert reason in expected, (reason, case.reason)
    if case.code is not None:
        assert err.details().startswith(f"{reason}: ")
    assert accepted_after == accepted


def _still_serving(trainer: Trainer) -> None:
    """Health says SERVING, the good generator is still connected and, once it leaves, a
    new valid generator takes its work and every sample it sends is accepted; the groups hold
    only valid samples."""
    health = health_pb2_grpc.HealthStub(trainer.channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    c = trainer.server.coordinator
    assert trainer.server.on_loop(lambda: set(c.replicas)) == {"good"}
    assert trainer.good.close() is None
    fresh = ConnectStream(trainer.channel)
    fresh.send(hello("fresh", capacity=8))
    fresh.next("welcome")
    fresh.next("new_weights")
    work = [fresh.next("assign").assign for _ in range(2)]
    assert sorted((w.prompt_id, tuple(w.sample_indices)) for w in work) == [("known", (1, 2, 3)),
                                                                          ("late", (1, 2, 3))]
    _, accepted = trainer.counts()
    for w in work:
        for i in w.sample_indices:
            fresh.send(_sample(w.prompt_id, i, PUBLISHED))
    _wait(trainer, "the fresh generator's six samples", lambda: c.counters.num_samples_accepted == accepted + 6)
    groups = trainer.server.call(c.take_groups(0, GROUP, GROUP)) + trainer.server.call(c.take_groups(3, GROUP, GROUP))
    assert [(g.prompt_id, len(g.samples)) for g in groups] == [("known", GROUP), ("late", GROUP)]
    for g in groups:
        assert [s.sample.generator_id for s in g.samples] == ["good", "fresh", "fresh", "fresh"]
        assert all(s.sample.completion_token_ids == (5, 2) and s.sample.logprobs == (-0.5, -0.5) for s in g.samples)
    assert fresh.close() is None


def test_every_generated_bad_sample_is_refused_with_its_reason_while_the_trainer_keeps_serving(trainer):
    @HYPOTHESIS
    @given(case=bad_samples())
    def play(case: Case) -> None:
        _play(trainer, case)

    play()
    refused, _ = trainer.counts()
    assert len(refused) >= 8  # Hypothesis reached most reasons
    _still_serving(trainer)


def test_samples_with_several_faults_are_refused_once_each(trainer):
    @HYPOTHESIS
    @given(case=mixed_bad_samples())
    def play(case: Case) -> None:
        _play(trainer, case)

    play()
    _still_serving(trainer)


def test_every_generated_bad_message_is_refused_with_its_reason_ending_only_its_stream_if_any(trainer):
    @settings(HYPOTHESIS, max_examples=80)
    @given(case=stream_breakers() | bad_reports())
    def play(case: Case) -> None:
        _play(trainer, case)

    play()
    refused, _ = trainer.counts()
    assert len(refused) >= 7
    _still_serving(trainer)
