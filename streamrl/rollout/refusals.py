"""What the trainer refuses from generators, decided in one place: the reasons (Refusal, the
`reason` label of streamrl_samples_refused), the checks of a sample before it may touch a
group and of Hellos' and reports' numbers. Knows no gRPC and no queue."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from streamrl.messages import LatencyPoints, LoadReport, WeightsLoaded
from streamrl.samples import Sample

if TYPE_CHECKING:
    from streamrl.rollout.work import InFlight

LOGPROB_TOLERANCE = 1e-3
"""A log-probability above this is a probability above 1 beyond float rounding (nats)."""
REQUEST_BASE_BYTES = 1 << 20
"""Room in a Connect message for everything but a sample's tokens (ids, latency profiles)."""
REQUEST_BYTES_PER_TOKEN = 10
"""A completion token on the wire: its id (varint, at most 5 bytes) and its log-prob (4)."""
MAX_MALFORMED_IN_A_ROW = 8
"""A replica whose last this many samples were all malformed is broken: its stream ends."""


class Refusal(StrEnum):
    """Why a sample or a Connect message was refused; the value is the metric label."""

    # A sample that was fine when sent, overtaken by events: dropped, nothing to redo.
    PREVIOUS_INCARNATION = "previous_incarnation"
    """Work an earlier start of the trainer handed out (its prompt is issued again)."""
    DUPLICATE = "duplicate"
    """Already accepted, or its prompt's group is complete (a late copy)."""
    # Malformed samples (a broken or hostile generator).
    UNKNOWN_PROMPT = "unknown_prompt"
    """A prompt id this trainer never issued."""
    INDEX_OUT_OF_RANGE = "index_out_of_range"
    """sample_index outside [0, group size)."""
    FINISH_REASON = "finish_reason"
    """Neither stop nor length (unspecified, or a value this trainer does not know)."""
    EMPTY_COMPLETION = "empty_completion"
    """No tokens (a generator always decodes at least one: max_new_tokens >= 1)."""
    TOO_LONG = "too_long"
    """More tokens than the job's algorithm.maxNewTokens."""
    LOGPROBS_MISMATCH = "logprobs_mismatch"
    """Not one log-prob per completion token."""
    TOKEN_OUT_OF_VOCAB = "token_out_of_vocab"
    """A token id outside the model's vocabulary (its config's vocab_size)."""
    BAD_LOGPROB = "bad_logprob"
    """NaN, infinite, or positive log-prob."""
    VERSION_RUNS = "version_runs"
    """version_runs that do not describe the completion: a run of no tokens, versions not ascending,
    a first version other than policy_version, or token counts that do not add up."""
    # Fine in form, wrong in version: the sample is generated again.
    FUTURE_VERSION = "future_version"
    """A token's version (its newest) beyond the newest version the trainer published."""
    STALE = "stale"
    """policy_version (its oldest token's) older than the staleness contract allows for its
    iteration (on arrival, or at consumption)."""
    # Reports with numbers the trainer cannot use: ignored, the stream goes on.
    BAD_LOAD_REPORT = "bad_load_report"
    """A LoadReport with a negative or non-finite number, or a latency profile that is not one."""
    BAD_WEIGHTS_LOADED = "bad_weights_loaded"
    """A WeightsLoaded of a version never published, or with a negative or non-finite sync_s."""
    # The Connect stream itself: it ends (INVALID_ARGUMENT, ALREADY_EXISTS for a taken id).
    NOT_HELLO = "not_hello"
    """The first message of a stream is not a Hello."""
    BAD_HELLO = "bad_hello"
    """A Hello with an empty generator_id, a capacity below 1 or a latency profile that is not one."""
    GENERATOR_ID_TAKEN = "generator_id_taken"
    """A Hello naming a generator that is connected already."""
    HELLO_AGAIN = "hello_again"
    """A second Hello on a stream."""
    EMPTY_MESSAGE = "empty_message"
    """A ConnectRequest with no message in it."""
    UNDECODABLE = "undecodable"
    """Bytes that are not a ConnectRequest."""
    OVERSIZED = "oversized"
    """A message larger than any valid one can be (SampleRules.max_request_bytes)."""


DROPPED_SAMPLES = frozenset({Refusal.PREVIOUS_INCARNATION, Refusal.DUPLICATE, Refusal.UNKNOWN_PROMPT,
                             Refusal.INDEX_OUT_OF_RANGE})
"""Refused samples with nothing to generate again (no such sample, or it is in already)."""
REISSUED = frozenset({Refusal.FINISH_REASON, Refusal.EMPTY_COMPLETION, Refusal.TOO_LONG, Refusal.LOGPROBS_MISMATCH,
                      Refusal.TOKEN_OUT_OF_VOCAB, Refusal.BAD_LOGPROB, Refusal.VERSION_RUNS, Refusal.FUTURE_VERSION,
                      Refusal.STALE})
"""Refused samples to generate again."""
MALFORMED = frozenset({Refusal.UNKNOWN_PROMPT, Refusal.INDEX_OUT_OF_RANGE, Refusal.FINISH_REASON,
                       Refusal.EMPTY_COMPLETION, Refusal.TOO_LONG, Refusal.LOGPROBS_MISMATCH,
                       Refusal.TOKEN_OUT_OF_VOCAB, Refusal.BAD_LOGPROB, Refusal.VERSION_RUNS})
"""Samples no healthy generator sends (MAX_MALFORMED_IN_A_ROW of them end its stream)."""
SAMPLE_REASONS = DROPPED_SAMPLES | MALFORMED | REISSUED
"""Why a sample (not a stream's other message) was refused."""
RACES = frozenset({Refusal.PREVIOUS_INCARNATION, Refusal.DUPLICATE, Refusal.FUTURE_VERSION, Refusal.STALE})
"""Refusals a healthy run meets too (a late copy, a resumed trainer, weights moving on)."""
STREAM = frozenset({Refusal.NOT_HELLO, Refusal.BAD_HELLO, Refusal.GENERATOR_ID_TAKEN, Refusal.HELLO_AGAIN,
                    Refusal.EMPTY_MESSAGE, Refusal.UNDECODABLE, Refusal.OVERSIZED})
"""Refusals that end the Connect stream (the replica's unfinished work goes elsewhere)."""


@dataclass(frozen=True)
class Refused:
    """A refusal and what exactly was wrong."""

    reason: Refusal
    detail: str
    """Names the field and the problem, for the log and the stream's status."""

    @property
    def reissue(self) -> bool:
        """The sample must be generated again (its prompt is in flight and lacks it)."""
        return self.reason in REISSUED


@dataclass(frozen=True)
class SampleRules:
    """What every sample must satisfy beyond its prompt's group: the job's and the model's limits."""

    max_new_tokens: int
    """algorithm.maxNewTokens: no completion is longer."""
    vocab_size: int | None = None
    """The trainer's model config's vocab_size (None: not known, token ids go unchecked)."""
    incarnation: int = 0
    """This start of the trainer; a sample of another is dropped."""

    @property
    def max_request_bytes(self) -> int:
        """The largest Connect message a valid generator can send (a sample of max_new_tokens)."""
        return REQUEST_BASE_BYTES + REQUEST_BYTES_PER_TOKEN * self.max_new_tokens


def check_sample(sample: Sample, task: InFlight | None, finished: bool, rules: SampleRules,
                 published_version: int) -> Refused | None:
    """None when the sample may join its group, else why not. `task` is its prompt in flight
    (None: unknown or finished, as `finished` says); `published_version` the newest version
    the trainer announced. The first failing check wins, in the order of Refusal."""
    if sample.incarnation != rules.incarnation:
        return Refused(Refusal.PREVIOUS_INCARNATION,
                       f"sample.incarnation {sample.incarnation} is not this trainer's {rules.incarnation}")
    if task is None:
        if finished:
            return Refused(Refusal.DUPLICATE, f"prompt {sample.prompt_id!r} is complete")
        return Refused(Refusal.UNKNOWN_PROMPT, f"sample.prompt_id {sample.prompt_id[:64]!r} was never issued")
    if sample.sample_index in task.received:
        return Refused(Refusal.DUPLICATE, f"sample {sample.sample_index} of {sample.prompt_id!r} is in already")
    if not 0 <= sample.sample_index < task.group_size:
        return Refused(Refusal.INDEX_OUT_OF_RANGE,
                       f"sample.sample_index {sample.sample_index} is outside [0, {task.group_size})")
    return _check_content(sample, rules) or _check_version(sample, task, published_version)


def _check_content(sample: Sample, rules: SampleRules) -> Refused | None:
    if sample.finish_reason not in ("stop", "length"):
        return Refused(Refusal.FINISH_REASON, f"sample.finish_reason {sample.finish_reason!r} is not stop or length")
    tokens, logprobs = sample.completion_token_ids, sample.logprobs
    if not tokens:
        return Refused(Refusal.EMPTY_COMPLETION, "sample.completion_token_ids is empty")
    if len(tokens) > rules.max_new_tokens:
        return Refused(Refusal.TOO_LONG, f"sample.completion_token_ids has {len(tokens)} tokens, more than "
                                         f"maxNewTokens {rules.max_new_tokens}")
    if len(logprobs) != len(tokens):
        return Refused(Refusal.LOGPROBS_MISMATCH,
                       f"sample.logprobs has {len(logprobs)} values for {len(tokens)} completion tokens")
    if rules.vocab_size is not None:
        bad = next((t for t in tokens if not 0 <= t < rules.vocab_size), None)
        if bad is not None:
            return Refused(Refusal.TOKEN_OUT_OF_VOCAB, f"sample.completion_token_ids holds {bad}, outside the "
                                                       f"model's vocabulary [0, {rules.vocab_size})")
    bad_lp = next((lp for lp in logprobs if not (math.isfinite(lp) and lp <= LOGPROB_TOLERANCE)), None)
    if bad_lp is not None:
        return Refused(Refusal.BAD_LOGPROB, f"sample.logprobs holds {bad_lp}: a log-prob is finite and <= 0")
    if (why := _version_runs_problem(sample)) is not None:
        return Refused(Refusal.VERSION_RUNS, f"sample.version_runs {why}")
    return None


def _version_runs_problem(sample: Sample) -> str | None:
    runs = sample.version_runs
    if not runs:
        return None
    if any(r.num_tokens < 1 for r in runs):
        return "has a run of no tokens"
    if any(a.policy_version >= b.policy_version for a, b in zip(runs, runs[1:])):
        return f"versions {[r.policy_version for r in runs][:16]} are not ascending"
    if runs[0].policy_version != sample.policy_version:
        return f"starts at version {runs[0].policy_version}, not at policy_version {sample.policy_version}"
    total = sum(r.num_tokens for r in runs)
    if total != len(sample.completion_token_ids):
        return f"counts {total} tokens for {len(sample.completion_token_ids)} completion tokens"
    return None


def _check_version(sample: Sample, task: InFlight, published_version: int) -> Refused | None:
    """A sample's tokens may mix versions (in-flight updates): its newest must have been
    published, and staleness counts from its oldest (policy_version), however new the rest."""
    if sample.newest_version > published_version:
        field = "version_runs ends at version" if sample.version_runs else "policy_version"
        return Refused(Refusal.FUTURE_VERSION, f"sample.{field} {sample.newest_version} is beyond the "
                                               f"newest published version {published_version}")
    if sample.policy_version < task.min_policy_version:
        return Refused(Refusal.STALE, f"sample.policy_version {sample.policy_version} is older than "
                                      f"{task.min_policy_version}, the oldest iteration {task.iteration} may use")
    return None


def check_latency_profile(points: LatencyPoints) -> str | None:
    """None for a usable PTL(BS), else what is wrong: batch sizes >= 1 and ascending, each
    once; seconds finite and >= 0 (the long-tail planner divides by their differences)."""
    sizes = [b for b, _ in points]
    if any(b < 1 for b in sizes) or any(b0 >= b1 for b0, b1 in zip(sizes, sizes[1:])):
        return f"latency_profile batch sizes {sizes[:16]} are not ascending, distinct and >= 1"
    bad = next((t for _, t in points if not (math.isfinite(t) and t >= 0)), None)
    if bad is not None:
        return f"latency_profile holds {bad} seconds per step"
    return None


def check_load_report(msg: LoadReport) -> Refused | None:
    numbers = {"tokens_per_s": msg.tokens_per_s, "skewness_bubble_s": msg.skewness_bubble_s}
    bad = next(((k, v) for k, v in numbers.items() if not (math.isfinite(v) and v >= 0)), None)
    if bad is not None:
        return Refused(Refusal.BAD_LOAD_REPORT, f"load.{bad[0]} is {bad[1]}")
    if (why := check_latency_profile(msg.latency_profile)) is not None:
        return Refused(Refusal.BAD_LOAD_REPORT, f"load.{why}")
    return None


def check_weights_loaded(msg: WeightsLoaded, published_version: int) -> Refused | None:
    if msg.policy_version > published_version:
        return Refused(Refusal.BAD_WEIGHTS_LOADED, f"weights_loaded.policy_version {msg.policy_version} was never "
                                                   f"published (the newest is {published_version})")
    if not (math.isfinite(msg.sync_s) and msg.sync_s >= 0):
        return Refused(Refusal.BAD_WEIGHTS_LOADED, f"weights_loaded.sync_s is {msg.sync_s}")
    return None


def worth_logging(count: int) -> bool:
    """Log the first refusals of a reason, then every thousandth (a flood stays readable)."""
    return count <= 10 or count % 1000 == 0
