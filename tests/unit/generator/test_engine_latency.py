"""PTL(BS) is what the engine's decode step costs, not its forward alone: measure_latency (what a
replica reports at start-up and `streamrl profile` records) and the steps it observes while
serving both time sampling and bookkeeping; measuring leaves the engine as it was."""

import time

import pytest

from streamrl.generator.engine import GenerationRequest
from streamrl.generator.torch_engine import TorchEngine
from streamrl.models import load_model, load_tokenizer

SAMPLING_DELAY_S = 0.02


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    return load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)


def _slow_sampling(engine: TorchEngine) -> TorchEngine:
    """Sampling made 20 ms slower than the forward could ever be on the tiny model."""
    sample = engine._sample

    def slow(*args):
        time.sleep(SAMPLING_DELAY_S)
        return sample(*args)

    engine._sample = slow
    return engine


def _generate(engine: TorchEngine, tok, text: str = "12..19:") -> tuple[int, ...]:
    ids = (tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"])
    engine.add_request(GenerationRequest("r", ids, 20, 1.0, 1.0, seed=7))
    while engine.has_unfinished():
        for done in engine.step():
            return done.token_ids
    raise AssertionError("no completion")


def test_measured_latency_includes_sampling_not_only_the_forward(model_and_tok):
    model, tok = model_and_tok
    engine = _slow_sampling(TorchEngine(model, 8, tok.eos_token_id))
    points = engine.measure_latency([1, 4], steps=3)
    assert [b for b, _ in points] == [1, 4]
    assert all(s >= SAMPLING_DELAY_S for _, s in points)  # the forward alone is ~1 ms
    assert all(s < 10 * SAMPLING_DELAY_S for _, s in points)  # the admitting step is not timed


def test_observed_decode_steps_include_sampling_too(model_and_tok):
    model, tok = model_and_tok
    engine = _slow_sampling(TorchEngine(model, 8, tok.eos_token_id))
    _generate(engine, tok)
    seen = dict(engine.latency_profile())
    assert seen and all(s >= SAMPLING_DELAY_S for s in seen.values())


def test_measuring_leaves_the_engine_as_it_was(model_and_tok):
    model, tok = model_and_tok
    fresh = _generate(TorchEngine(model, 8, tok.eos_token_id), tok)
    engine = TorchEngine(model, 8, tok.eos_token_id)
    engine.set_batch_cap(2)
    engine.measure_latency([1, 8, 64], steps=2)  # 64: clipped to the capacity
    assert [b for b, _ in engine.latency_profile()] == [1, 8]
    assert not engine.has_unfinished()
    assert engine.eos_token_id == tok.eos_token_id and engine.batch_cap == 2
    assert engine.stats().num_generated_tokens == 0
    assert _generate(engine, tok) == fresh  # same sample, the borrowed slots' cache notwithstanding
    assert engine.stats().num_generated_tokens == len(fresh)


def test_latency_at_another_context_is_measured_but_not_reported(model_and_tok):
    model, tok = model_and_tok
    engine = TorchEngine(model, 8, tok.eos_token_id, max_len=64)
    points = engine.measure_latency([1, 8], steps=2, context=48)
    assert [b for b, _ in points] == [1, 8] and all(s > 0 for _, s in points)
    assert engine.latency_profile() == []  # a replica reports PTL at its own context only
    with pytest.raises(ValueError, match="context 60: must be 1..59"):
        engine.measure_latency([1], steps=2, context=60)
