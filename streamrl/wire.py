"""Proto <-> domain conversion for the streamrl.v1 messages, in one place."""

from __future__ import annotations

from streamrl.samples import Sample, WeightsNotice, Work
from streamrl.v1 import rollout_pb2 as pb

# gRPC channel/server options: weights travel in 1 MiB chunks, so 16 MiB leaves headroom.
MAX_MESSAGE_BYTES = 16 << 20
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]

_FINISH_TO_PB = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}
_FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}


def sample_to_pb(s: Sample) -> pb.Sample:
    return pb.Sample(
        prompt_id=s.prompt_id, sample_index=s.sample_index, completion_token_ids=s.completion_token_ids,
        logprobs=s.logprobs, policy_version=s.policy_version, finish_reason=_FINISH_TO_PB[s.finish_reason],
        queue_s=s.queue_s, generate_s=s.generate_s,
    )


def sample_from_pb(m: pb.Sample, generator_id: str) -> Sample:
    return Sample(
        m.prompt_id, m.sample_index, tuple(m.completion_token_ids), tuple(m.logprobs), m.policy_version,
        _FINISH_FROM_PB.get(m.finish_reason, "stop"), generator_id, m.queue_s, m.generate_s,
    )


def work_to_pb(w: Work) -> pb.Assign:
    return pb.Assign(
        prompt_id=w.prompt_id, prompt_token_ids=w.prompt_token_ids, sample_indices=w.sample_indices,
        sampling=pb.SamplingParams(temperature=w.temperature, top_p=w.top_p, max_new_tokens=w.max_new_tokens,
                                   seed=w.seed),
        min_policy_version=w.min_policy_version, priority=w.priority,
    )


def work_from_pb(m: pb.Assign) -> Work:
    s = m.sampling
    return Work(m.prompt_id, tuple(m.prompt_token_ids), tuple(m.sample_indices), s.temperature, s.top_p,
                s.max_new_tokens, s.seed, m.min_policy_version, m.priority)


def notice_to_pb(n: WeightsNotice) -> pb.NewWeights:
    return pb.NewWeights(policy_version=n.policy_version, size_bytes=n.size_bytes, num_chunks=n.num_chunks,
                         sha256=n.sha256, source=n.source)


def notice_from_pb(m: pb.NewWeights) -> WeightsNotice:
    return WeightsNotice(m.policy_version, m.size_bytes, m.num_chunks, m.sha256, m.source)
