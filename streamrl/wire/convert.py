"""protobuf <-> domain conversion of every streamrl.v1 message, in one place. Both ends of a
stream queue domain messages (streamrl.messages, streamrl.samples); these functions turn
them into wire messages on the way out and back on the way in. A malformed message raises
ValueError naming what is wrong (the servicer maps it to INVALID_ARGUMENT)."""

from __future__ import annotations

from streamrl.messages import (
    BatchCap,
    Draining,
    Hello,
    LatencyPoints,
    LengthObservation,
    LoadReport,
    WeightsLoaded,
    WeightsNotice,
    Welcome,
    Work,
)
from streamrl.samples import Sample, VersionRun
from streamrl.v1 import ranker_pb2 as rpb
from streamrl.v1 import rollout_pb2 as pb

_FINISH_TO_PB = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}
_FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}

GeneratorMessage = Hello | Sample | LoadReport | WeightsLoaded | Draining
TrainerMessage = Welcome | Work | WeightsNotice | BatchCap


def _points_to_pb(points: LatencyPoints) -> list[pb.LatencyPoint]:
    return [pb.LatencyPoint(batch_size=b, seconds_per_step=s) for b, s in points]


def _points_from_pb(points) -> LatencyPoints:
    return tuple((p.batch_size, p.seconds_per_step) for p in points)


def sample_to_pb(s: Sample) -> pb.Sample:
    return pb.Sample(
        prompt_id=s.prompt_id, sample_index=s.sample_index, completion_token_ids=s.completion_token_ids,
        logprobs=s.logprobs, policy_version=s.policy_version, finish_reason=_FINISH_TO_PB[s.finish_reason],
        queue_s=s.queue_s, generate_s=s.generate_s, incarnation=s.incarnation,
        version_runs=[pb.VersionRun(policy_version=r.policy_version, num_tokens=r.num_tokens) for r in s.version_runs],
    )


def _finish_from_pb(value: pb.FinishReason) -> str:
    """"stop" or "length"; anything else keeps its wire name (the trainer's intake refuses it)."""
    if value in _FINISH_FROM_PB:
        return _FINISH_FROM_PB[value]
    return pb.FinishReason.Name(value) if value in pb.FinishReason.values() else f"FinishReason {value}"


def sample_from_pb(m: pb.Sample, generator_id: str) -> Sample:
    return Sample(
        m.prompt_id, m.sample_index, tuple(m.completion_token_ids), tuple(m.logprobs), m.policy_version,
        _finish_from_pb(m.finish_reason), generator_id, m.queue_s, m.generate_s, m.incarnation,
        tuple(VersionRun(r.policy_version, r.num_tokens) for r in m.version_runs),
    )


def work_to_pb(w: Work) -> pb.Assign:
    return pb.Assign(
        prompt_id=w.prompt_id, prompt_token_ids=w.prompt_token_ids, sample_indices=w.sample_indices,
        sampling=pb.SamplingParams(temperature=w.temperature, top_p=w.top_p, max_new_tokens=w.max_new_tokens,
                                   seed=w.seed),
        min_policy_version=w.min_policy_version, priority=w.priority, incarnation=w.incarnation,
    )


def work_from_pb(m: pb.Assign) -> Work:
    s = m.sampling
    return Work(m.prompt_id, tuple(m.prompt_token_ids), tuple(m.sample_indices), s.temperature, s.top_p,
                s.max_new_tokens, s.seed, m.min_policy_version, m.priority, m.incarnation)


def notice_to_pb(n: WeightsNotice) -> pb.NewWeights:
    return pb.NewWeights(policy_version=n.policy_version, size_bytes=n.size_bytes, num_chunks=n.num_chunks,
                         sha256=n.sha256, source=n.source)


def notice_from_pb(m: pb.NewWeights) -> WeightsNotice:
    return WeightsNotice(m.policy_version, m.size_bytes, m.num_chunks, m.sha256, m.source)


# ---- the Connect stream, generator -> trainer ---------------------------------------------

def request_to_pb(msg: GeneratorMessage) -> pb.ConnectRequest:
    match msg:
        case Sample():
            return pb.ConnectRequest(sample=sample_to_pb(msg))
        case LoadReport():
            return pb.ConnectRequest(load=pb.LoadReport(
                num_running=msg.num_running, num_waiting=msg.num_waiting,
                num_generated_tokens=msg.num_generated_tokens, tokens_per_s=msg.tokens_per_s,
                latency_profile=_points_to_pb(msg.latency_profile), skewness_bubble_s=msg.skewness_bubble_s))
        case WeightsLoaded():
            return pb.ConnectRequest(weights_loaded=pb.WeightsLoaded(
                policy_version=msg.policy_version, sync_s=msg.sync_s, size_bytes=msg.size_bytes, source=msg.source))
        case Draining():
            return pb.ConnectRequest(draining=pb.Draining(reason=msg.reason))
        case Hello():
            return pb.ConnectRequest(hello=pb.Hello(
                generator_id=msg.generator_id, pool=msg.pool, capacity=msg.capacity, engine=msg.engine,
                policy_version=msg.policy_version, weights_address=msg.weights_address,
                latency_profile=_points_to_pb(msg.latency_profile), started_unix=msg.started_unix,
                weights_sha256=msg.weights_sha256, without_weights=msg.without_weights))
    raise TypeError(f"not a generator message: {msg!r}")


def request_from_pb(req: pb.ConnectRequest, generator_id: str) -> GeneratorMessage:
    """A generator's message; samples are attributed to `generator_id` (the stream's)."""
    kind = req.WhichOneof("kind")
    if kind == "sample":
        return sample_from_pb(req.sample, generator_id)
    if kind == "load":
        m = req.load
        return LoadReport(m.num_running, m.num_waiting, m.num_generated_tokens, m.tokens_per_s,
                          _points_from_pb(m.latency_profile), m.skewness_bubble_s)
    if kind == "weights_loaded":
        m = req.weights_loaded
        return WeightsLoaded(m.policy_version, m.sync_s, m.size_bytes, m.source)
    if kind == "draining":
        return Draining(req.draining.reason)
    if kind == "hello":
        m = req.hello
        return Hello(m.generator_id, m.pool, m.capacity, m.engine, m.policy_version, m.weights_address,
                     _points_from_pb(m.latency_profile), m.started_unix, m.weights_sha256, m.without_weights)
    raise ValueError("ConnectRequest carries no message (kind is empty)")


# ---- the Connect stream, trainer -> generator ---------------------------------------------

def response_to_pb(msg: TrainerMessage) -> pb.ConnectResponse:
    match msg:
        case Work():
            return pb.ConnectResponse(assign=work_to_pb(msg))
        case WeightsNotice():
            return pb.ConnectResponse(new_weights=notice_to_pb(msg))
        case BatchCap():
            return pb.ConnectResponse(configure=pb.Configure(max_batch_size=msg.max_batch_size))
        case Welcome():
            return pb.ConnectResponse(welcome=pb.Welcome(run_id=msg.run_id, policy_version=msg.policy_version,
                                                         incarnation=msg.incarnation))
    raise TypeError(f"not a trainer message: {msg!r}")


def response_from_pb(resp: pb.ConnectResponse) -> TrainerMessage | None:
    """The trainer's message; None for a kind this replica does not know (a newer trainer)."""
    kind = resp.WhichOneof("kind")
    if kind == "assign":
        return work_from_pb(resp.assign)
    if kind == "new_weights":
        return notice_from_pb(resp.new_weights)
    if kind == "configure":
        return BatchCap(resp.configure.max_batch_size)
    if kind == "welcome":
        return Welcome(resp.welcome.run_id, resp.welcome.policy_version, resp.welcome.incarnation)
    return None


# ---- the ranker ---------------------------------------------------------------------------

def rank_request_to_pb(prompts: list[tuple[str, str]]) -> rpb.RankRequest:
    """(prompt key, text) pairs."""
    return rpb.RankRequest(prompts=[rpb.RankedPrompt(prompt_key=key, text=text) for key, text in prompts])


def _prompt_from_pb(prompt: rpb.RankedPrompt) -> tuple[str, str]:
    if not prompt.prompt_key and not prompt.text:
        raise ValueError("a prompt needs a prompt_key or a text")
    return prompt.prompt_key or prompt.text, prompt.text


def rank_request_from_pb(req: rpb.RankRequest) -> list[tuple[str, str]]:
    return [_prompt_from_pb(p) for p in req.prompts]


def predictions_to_pb(ranked: list[tuple[float, int]]) -> rpb.RankResponse:
    """(predicted length, rank) per prompt, in the request's order."""
    return rpb.RankResponse(predictions=[rpb.Prediction(predicted_length=length, rank=rank)
                                         for length, rank in ranked])


def predictions_from_pb(resp: rpb.RankResponse) -> list[float]:
    """Predicted lengths, in the request's order."""
    return [p.predicted_length for p in resp.predictions]


def observation_to_pb(obs: LengthObservation) -> rpb.ObserveRequest:
    return rpb.ObserveRequest(prompt=rpb.RankedPrompt(prompt_key=obs.prompt_key, text=obs.text),
                              policy_version=obs.policy_version, lengths=obs.lengths)


def observed_to_pb(num_observed: int) -> rpb.ObserveResponse:
    return rpb.ObserveResponse(num_observed=num_observed)


def observation_from_pb(req: rpb.ObserveRequest) -> LengthObservation:
    key, text = _prompt_from_pb(req.prompt)
    if not req.lengths:
        raise ValueError(f"observation of {key!r} has no lengths")
    return LengthObservation(key, text, req.policy_version, tuple(req.lengths))
