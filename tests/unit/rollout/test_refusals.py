"""Sample intake: each refusal reason on its own, what a refusal does to the replica's work,
and how refusals are counted (run totals and Prometheus)."""

import asyncio
import math
from dataclasses import replace

import pytest

from streamrl.messages import Hello, LoadReport, WeightsLoaded, WeightsNotice, Work
from streamrl.metrics import SAMPLES_REFUSED, ServiceMetrics
from streamrl.records import RunSummary
from streamrl.rollout.refusals import (
    MALFORMED,
    MAX_MALFORMED_IN_A_ROW,
    STREAM,
    Refusal,
    Refused,
    SampleRules,
    check_latency_profile,
    check_load_report,
    check_sample,
    check_weights_loaded,
)
from streamrl.rollout.work import InFlight, PromptWork, SamplingConfig
from streamrl.samples import Sample, VersionRun
from streamrl.trainer.coordinator import Coordinator

VOCAB = 50
RULES = SampleRules(max_new_tokens=6, vocab_size=VOCAB, incarnation=2)
GOOD = Sample("p0", 1, (7, 8, 2), (-0.5, -1.5, 0.0), 3, "stop", "g", incarnation=2)


def _task(min_policy_version: int = 2) -> InFlight:
    task = InFlight(PromptWork("p0", 0, "7", (1, 5)), iteration=4, group_size=4, seed=0,
                    min_policy_version=min_policy_version)
    task.received[0] = (replace(GOOD, sample_index=0), 1.0)
    return task


def _check(sample: Sample, in_flight: bool = True, finished: bool = False):
    """Checked against prompt p0 in flight (sample 0 in), or no prompt in flight; version 3 published."""
    return check_sample(sample, _task() if in_flight else None, finished, RULES, 3)


def test_a_well_formed_sample_passes():
    assert _check(GOOD) is None
    assert _check(replace(GOOD, logprobs=(-0.5, -1.5, 1e-4), finish_reason="length")) is None  # float rounding
    assert _check(replace(GOOD, completion_token_ids=(0, VOCAB - 1, 2), policy_version=2)) is None
    assert _check(replace(GOOD, policy_version=2, version_runs=(VersionRun(2, 1), VersionRun(3, 2)))) is None
    assert _check(replace(GOOD, version_runs=(VersionRun(3, 3),))) is None  # one run: all policy_version's


@pytest.mark.parametrize(("sample", "reason", "field"), [
    (replace(GOOD, incarnation=1), Refusal.PREVIOUS_INCARNATION, "incarnation"),
    (replace(GOOD, sample_index=0), Refusal.DUPLICATE, "is in already"),
    (replace(GOOD, sample_index=4), Refusal.INDEX_OUT_OF_RANGE, "sample_index 4"),
    (replace(GOOD, sample_index=-1), Refusal.INDEX_OUT_OF_RANGE, "sample_index -1"),
    (replace(GOOD, finish_reason="FINISH_REASON_UNSPECIFIED"), Refusal.FINISH_REASON, "finish_reason"),
    (replace(GOOD, completion_token_ids=(), logprobs=()), Refusal.EMPTY_COMPLETION, "completion_token_ids"),
    (replace(GOOD, completion_token_ids=(7,) * 7, logprobs=(-1.0,) * 7), Refusal.TOO_LONG, "7 tokens"),
    (replace(GOOD, logprobs=(-0.5, -1.5)), Refusal.LOGPROBS_MISMATCH, "2 values for 3"),
    (replace(GOOD, logprobs=(-0.5, -1.5, -1.0, -1.0)), Refusal.LOGPROBS_MISMATCH, "4 values for 3"),
    (replace(GOOD, completion_token_ids=(7, VOCAB, 2)), Refusal.TOKEN_OUT_OF_VOCAB, f"holds {VOCAB}"),
    (replace(GOOD, completion_token_ids=(7, -3, 2)), Refusal.TOKEN_OUT_OF_VOCAB, "holds -3"),
    (replace(GOOD, logprobs=(-0.5, math.nan, -1.0)), Refusal.BAD_LOGPROB, "nan"),
    (replace(GOOD, logprobs=(-0.5, -math.inf, -1.0)), Refusal.BAD_LOGPROB, "-inf"),
    (replace(GOOD, logprobs=(math.inf, -0.5, -1.0)), Refusal.BAD_LOGPROB, "inf"),
    (replace(GOOD, logprobs=(-0.5, -1.0, 0.25)), Refusal.BAD_LOGPROB, "0.25"),
    (replace(GOOD, policy_version=4), Refusal.FUTURE_VERSION, "policy_version 4"),
    (replace(GOOD, policy_version=1), Refusal.STALE, "older than 2"),
    # In-flight updates: the tokens' versions, run-length.
    (replace(GOOD, version_runs=(VersionRun(3, 2), VersionRun(4, 1))), Refusal.FUTURE_VERSION,
     "version_runs ends at version 4"),
    (replace(GOOD, policy_version=1, version_runs=(VersionRun(1, 1), VersionRun(3, 2))), Refusal.STALE,
     "policy_version 1 is older than 2"),
    (replace(GOOD, policy_version=2, version_runs=(VersionRun(2, 1), VersionRun(3, 1))), Refusal.VERSION_RUNS,
     "counts 2 tokens for 3"),
    (replace(GOOD, policy_version=2, version_runs=(VersionRun(3, 1), VersionRun(2, 2))), Refusal.VERSION_RUNS,
     "not ascending"),
    (replace(GOOD, policy_version=2, version_runs=(VersionRun(3, 1), VersionRun(3, 2))), Refusal.VERSION_RUNS,
     "not ascending"),
    (replace(GOOD, policy_version=2, version_runs=(VersionRun(3, 1), VersionRun(4, 2))), Refusal.VERSION_RUNS,
     "starts at version 3, not at policy_version 2"),
    (replace(GOOD, policy_version=2, version_runs=(VersionRun(2, 3), VersionRun(3, 0))), Refusal.VERSION_RUNS,
     "a run of no tokens"),
])
def test_each_malformed_or_misplaced_sample_is_refused_naming_the_field(sample, reason, field):
    refused = _check(sample)
    assert refused is not None and refused.reason is reason
    assert field in refused.detail


def test_unknown_and_finished_prompts_are_told_apart():
    assert _check(replace(GOOD, prompt_id="nope"), in_flight=False).reason is Refusal.UNKNOWN_PROMPT
    assert _check(replace(GOOD, prompt_id=""), in_flight=False).reason is Refusal.UNKNOWN_PROMPT
    assert _check(GOOD, in_flight=False, finished=True).reason is Refusal.DUPLICATE


def test_vocabulary_goes_unchecked_only_when_the_model_is_unknown():
    wide = replace(GOOD, completion_token_ids=(7, 10_000, 2))
    assert check_sample(wide, _task(), False, replace(RULES, vocab_size=None), 3) is None
    assert check_sample(wide, _task(), False, RULES, 3).reason is Refusal.TOKEN_OUT_OF_VOCAB


def test_the_message_size_limit_holds_a_sample_of_max_new_tokens():
    rules = SampleRules(max_new_tokens=100_000)
    assert rules.max_request_bytes == (1 << 20) + 10 * 100_000


def test_only_samples_that_exist_and_are_missing_are_generated_again():
    reissued = {r for r in Refusal if Refused(r, "").reissue}
    assert {r.value for r in reissued} == {"finish_reason", "empty_completion", "too_long", "logprobs_mismatch",
                                           "token_out_of_vocab", "bad_logprob", "version_runs", "future_version",
                                           "stale"}
    assert Refusal.INDEX_OUT_OF_RANGE in MALFORMED  # malformed, yet there is no such sample to generate
    assert not reissued & STREAM


def test_a_latency_profile_the_planner_cannot_use_is_named():
    assert check_latency_profile(()) is None and check_latency_profile(((1, 0.01), (4, 0.02))) is None
    assert "not ascending, distinct" in check_latency_profile(((4, 0.01), (4, 0.02)))
    assert "not ascending, distinct" in check_latency_profile(((0, 0.01),))
    assert "holds nan seconds" in check_latency_profile(((1, math.nan),))
    assert "holds -1.0 seconds" in check_latency_profile(((1, 0.1), (2, -1.0)))


def test_reports_with_numbers_the_trainer_cannot_use_are_refused():
    assert check_load_report(LoadReport(1, 0, 10, 5.0, ((1, 0.1),), 0.5)) is None
    assert check_load_report(LoadReport(1, 0, 10, math.inf, (), 0.0)).detail == "load.tokens_per_s is inf"
    assert check_load_report(LoadReport(1, 0, 10, 1.0, (), -2.0)).detail == "load.skewness_bubble_s is -2.0"
    assert check_load_report(LoadReport(1, 0, 10, 1.0, ((2, 0.1), (1, 0.1)), 0.0)).reason is Refusal.BAD_LOAD_REPORT
    assert check_weights_loaded(WeightsLoaded(3, 0.5, 10, "trainer"), published_version=3) is None
    assert "never published" in check_weights_loaded(WeightsLoaded(4, 0.5, 10, "trainer"), 3).detail
    assert check_weights_loaded(WeightsLoaded(3, math.nan, 10, "peer"), 3).reason is Refusal.BAD_WEIGHTS_LOADED


# ---- through the coordinator ---------------------------------------------------------------

def _coordinator(vocab_size: int | None = VOCAB, incarnation: int = 0) -> Coordinator:
    return Coordinator(SamplingConfig(1.0, 1.0, 6, 0, incarnation), lambda s, a: 1.0, ServiceMetrics("trainer"),
                       queue_factor=1, vocab_size=vocab_size)


def _drain(replica) -> list:
    out = []
    while not replica.outbox.empty():
        out.append(replica.outbox.get_nowait())
    return out


def _sample(prompt_id: str, i: int, gid: str = "a", **fields) -> Sample:
    return replace(Sample(prompt_id, i, (7, 2), (-0.1, -0.2), 0, "stop", gid), **fields)


def _refused_metric(c: Coordinator, reason: Refusal) -> float:
    return c.metrics.registry.get_sample_value(f"{SAMPLES_REFUSED}_total", {"reason": reason.value})


def test_a_refused_sample_reaches_no_group_and_is_counted_by_reason():
    async def go():
        c = _coordinator()
        c.connect(Hello("a", "p", 8, "torch", 0))
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=0)
        bad = [_sample("p0", 0, logprobs=(math.nan, -0.1)), _sample("p0", 0, completion_token_ids=(7, 99)),
               _sample("p0", 1, policy_version=5), _sample("p0", 7), _sample("zz", 0), _sample("p0", 0, incarnation=3)]
        assert [c.on_sample("a", s) for s in bad] == [False] * 6
        assert c.book.get("p0").received == {}
        assert c.counters.num_samples_accepted == 0
        assert c.counters.num_samples_refused == {"bad_logprob": 1, "token_out_of_vocab": 1, "future_version": 1,
                                                  "index_out_of_range": 1, "unknown_prompt": 1,
                                                  "previous_incarnation": 1}
        assert c.counters.num_samples_rejected == 4 and c.counters.num_samples_previous_incarnation == 1
        assert _refused_metric(c, Refusal.BAD_LOGPROB) == 1.0
        assert _refused_metric(c, Refusal.OVERSIZED) == 0.0  # every reason is exported from the start
        assert c.on_sample("a", _sample("p0", 0)) and c.on_sample("a", _sample("p0", 1))
        [group] = await c.take_groups(0, 2, 2)
        assert [s.sample for s in group.samples] == [_sample("p0", 0), _sample("p0", 1)]

    asyncio.run(go())


def test_a_refused_sample_its_sender_held_is_reissued_and_one_it_did_not_hold_is_only_counted():
    async def go():
        c = _coordinator()
        a = c.connect(Hello("a", "p", 2, "torch", 0))
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=0)
        [work] = _drain(a)
        assert work.sample_indices == (0, 1)
        b = c.connect(Hello("b", "p", 2, "torch", 0))
        assert c.on_sample("b", _sample("p0", 0, gid="b", logprobs=(0.5, -0.1))) is False  # b never held it
        assert _drain(b) == [] and _drain(a) == [] and a.outstanding == {("p0", 0), ("p0", 1)}
        assert c.on_sample("a", _sample("p0", 0, logprobs=(0.5, -0.1))) is False  # a held it: generated again
        assert a.outstanding == {("p0", 1)} and b.outstanding == {("p0", 0)}  # b had the most room
        [again] = _drain(b)
        assert isinstance(again, Work) and again.sample_indices == (0,) and _drain(a) == []
        assert c.counters.num_samples_refused == {"bad_logprob": 2}

    asyncio.run(go())


def test_an_index_outside_the_group_is_never_generated_again():
    async def go():
        c = _coordinator()
        a = c.connect(Hello("a", "p", 8, "torch", 0))
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=0)
        _drain(a)
        assert c.on_sample("a", _sample("p0", 2)) is False
        assert _drain(a) == [] and c.status()["num_samples_pending"] == 0

    asyncio.run(go())


def test_a_sample_of_an_earlier_incarnation_leaves_the_current_assignment_outstanding():
    """A resumed trainer issues the same prompt ids again: an old copy under the same key must
    not free the slot of the sample being generated now."""

    async def go():
        c = _coordinator(incarnation=1)
        a = c.connect(Hello("a", "p", 8, "torch", 0))
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=0)
        _drain(a)
        assert c.on_sample("a", _sample("p0", 0, incarnation=0)) is False
        assert ("p0", 0) in a.outstanding and _drain(a) == []
        assert c.on_sample("a", _sample("p0", 0, incarnation=1)) is True

    asyncio.run(go())


def test_samples_of_a_version_not_yet_published_are_refused_until_it_is():
    async def go():
        c = _coordinator()
        a = c.connect(Hello("a", "p", 8, "torch", 0))
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=0)
        _drain(a)
        assert c.on_sample("a", _sample("p0", 0, policy_version=1)) is False
        c.announce(WeightsNotice(1, 10, 1, "ab"))
        assert c.on_sample("a", _sample("p0", 0, policy_version=1)) is True

    asyncio.run(go())


def test_a_replica_sending_only_malformed_samples_is_cut_off_and_one_good_sample_resets_the_count():
    async def go():
        c = _coordinator()
        c.connect(Hello("a", "p", 8, "torch", 0))
        c.add_prompts(0, [PromptWork(f"p{i}", i, "7", (1,)) for i in range(2)], group_size=2, min_policy_version=0)
        assert c.on_sample("a", _sample("p1", 0))
        bad = _sample("p0", 1, completion_token_ids=(), logprobs=())
        for _ in range(MAX_MALFORMED_IN_A_ROW - 1):
            c.on_sample("a", bad)
        assert c.on_sample("a", _sample("p0", 0))  # a good one: the count starts over
        for _ in range(MAX_MALFORMED_IN_A_ROW - 1):
            c.on_sample("a", bad)
            c.on_sample("a", _sample("p1", 0))  # a duplicate: neither malformed nor good
        with pytest.raises(ValueError, match=r"generator a sent 8 malformed samples in a row, the last "
                                             r"empty_completion: sample.completion_token_ids is empty"):
            c.on_sample("a", bad)
        assert c.counters.num_samples_refused["empty_completion"] == 2 * MAX_MALFORMED_IN_A_ROW - 1

    asyncio.run(go())


def test_refusals_reach_the_run_summary():
    c = _coordinator()
    c.groups.receive(_sample("zz", 0))
    summary = RunSummary.of([], phase="Succeeded", mode="stream-async", wall_s=1.0, weight_bytes_from_trainer=0,
                            weight_bytes_from_peers=0, **c.counters.totals())
    assert summary.num_samples_refused == {"unknown_prompt": 1} and summary.num_samples_rejected == 1
    assert RunSummary.model_validate_json(summary.to_json()).num_samples_refused == {"unknown_prompt": 1}


def test_a_bad_report_is_ignored_and_counted_while_a_bad_hello_profile_is_refused():
    async def go():
        c = _coordinator()
        with pytest.raises(ValueError, match=r"hello.latency_profile batch sizes \[2, 2\]"):
            c.connect(Hello("a", "p", 4, "torch", 0, latency_profile=((2, 0.1), (2, 0.2))))
        a = c.connect(Hello("a", "p", 4, "torch", 0, latency_profile=((1, 0.1),)))
        good = LoadReport(1, 0, 10, 5.0, ((1, 0.2),), 0.5)
        c.on_message("a", good)
        c.on_message("a", LoadReport(1, 0, 10, math.nan, ((1, 0.3),), 0.5))
        c.on_message("a", WeightsLoaded(9, 0.1, 10, "trainer"))  # never published
        assert a.load == good and a.latency_profile == ((1, 0.2),) and a.policy_version == 0
        assert c.counters.num_samples_refused == {"bad_load_report": 1, "bad_weights_loaded": 1}
        assert c.counters.num_samples_rejected == 0  # not samples

    asyncio.run(go())
