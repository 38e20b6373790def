"""What `streamrl profile` measures of an engine, measured as a replica runs it: on a thread of
its own (not the main thread, where a multi-threaded torch decodes up to twice as fast), PTL at
the engine's own context and a long one, and a weight version swapped in."""

import threading

import pytest

from streamrl.generator.profile import context_slope, measure_generation
from streamrl.generator.torch_engine import TorchEngine
from streamrl.models import load_model, load_tokenizer


class _ThreadNotingEngine(TorchEngine):
    """The torch engine, noting the thread each measurement ran on and the contexts asked for."""

    def __init__(self, *args):
        super().__init__(*args)
        self.threads: set[str] = set()
        self.contexts: list[int | None] = []

    def measure_latency(self, batch_sizes, steps=4, context=None):
        self.threads.add(threading.current_thread().name)
        self.contexts.append(context)
        return super().measure_latency(batch_sizes, steps, context)


def test_generation_is_measured_on_an_engine_thread_at_two_contexts(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    engine = _ThreadNotingEngine(load_model(tiny_model_dir), 4, tok.eos_token_id)
    held = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
    m = measure_generation(engine, [1, 4], steps=2, prompt_tokens=8, rounds=2, long_context=40)
    assert engine.threads and threading.main_thread().name not in engine.threads
    assert engine.contexts == [None, None, 40, 40]  # rounds at its own context, then at the long one
    assert [b for b, _ in m.ptl] == [1, 4] and (m.ptl_context, m.long_context) == (16, 40)
    assert m.context_s_per_token >= 0 and 0 < m.weight_load_s < 1
    # admissions of 1 and 4 prompts (the engine's capacity caps 16 and 64): a step's fixed part
    # and a part per prompt token, both measured
    assert m.prefill_s_per_step > 0 and m.prefill_s_per_token > 0
    assert m.prefill_s_per_step + 32 * m.prefill_s_per_token < 0.5
    assert engine.policy_version == 0  # the weights swapped in for timing are swapped out again
    assert all(p.equal(held[name]) for name, p in engine.model.named_parameters())


class _AdmissionNotingEngine(TorchEngine):
    """The torch engine, noting (sequences running, prompts waiting) before each step that admits."""

    def __init__(self, *args):
        super().__init__(*args)
        self.admitting: list[tuple[int, int]] = []

    def step(self):
        st = self.stats()
        if st.num_waiting:
            self.admitting.append((st.num_running, st.num_waiting))
        return super().step()


def test_admissions_are_timed_beside_a_running_batch_that_fills_the_engine(tiny_model_dir):
    """Serving admits prompts into a running batch, which costs more than into an idle engine:
    1 prompt joins 3 running sequences (capacity 4), 4 prompts an empty engine; each admitting
    step timed less the next step, the same batch decoding."""
    tok = load_tokenizer(tiny_model_dir)
    engine = _AdmissionNotingEngine(load_model(tiny_model_dir), 4, tok.eos_token_id)
    m = measure_generation(engine, [1, 2, 4], steps=2, prompt_tokens=8, rounds=1, prefill_batches=(1, 4),
                           prefill_rounds=3)
    # PTL's steady batches join an idle engine once per batch size: (0, 1), (0, 2), (0, 4)
    assert engine.admitting.count((3, 1)) == 4  # a warm-up and 3 timed rounds beside 3 running
    assert engine.admitting.count((0, 3)) == 1  # those 3 joined once, untimed
    assert engine.admitting.count((0, 4)) == 1 + 4  # PTL(4), then 4 prompts into the empty engine, 4 rounds
    assert len(engine.admitting) == 3 + 4 + 1 + 4
    assert m.prefill_s_per_step + 8 * m.prefill_s_per_token > 0
    assert not engine.has_unfinished() and engine.stats().num_running == 0  # the running batch was let go


def test_generation_is_measured_on_the_thread_it_is_given(tiny_model_dir):
    """`streamrl profile` hands it the engine thread it keeps alive beside the learner's."""
    from concurrent.futures import ThreadPoolExecutor

    tok = load_tokenizer(tiny_model_dir)
    engine = _ThreadNotingEngine(load_model(tiny_model_dir), 4, tok.eos_token_id)
    with ThreadPoolExecutor(1, thread_name_prefix="given") as given:
        measure_generation(engine, [1, 4], steps=2, prompt_tokens=8, rounds=1, thread=given)
        assert engine.threads == {"given_0"}
        assert given.submit(lambda: 1).result() == 1  # still serving: the measurement did not shut it down


def test_the_context_slope_is_fitted_per_sequence_per_token():
    short = [(1, 1.0), (4, 2.0)]
    long = [(1, 1.0 + 1 * 10 * 0.01), (4, 2.0 + 4 * 10 * 0.01)]
    assert context_slope(short, long, 10) == pytest.approx(0.01)
    assert context_slope(long, short, 10) == 0.0  # faster further in is noise, not a negative cost

