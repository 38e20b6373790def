"""What `streamrl profile` measures of an engine, measured as a replica runs it: on a thread of
its own (not the main thread, where a multi-threaded torch decodes up to twice as fast), PTL at
the engine's own context and a long one, and a weight version swapped in."""

import threading

import pytest

from streamrl.generator.engine import Completion, Engine, EngineStats
from streamrl.generator.profile import _admission_s, context_slope, measure_generation
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
    # and a part per prompt token. Two points on a tiny model under a loaded CI can fit a negative
    # fixed part, which the fit refits through the origin (tests/unit/trainer/test_micro_batch_fit.py
    # checks that it finds a real one): the per-token part is always measured.
    assert m.prefill_s_per_step >= 0 and m.prefill_s_per_token > 0
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


class _OneTokenAdmissionEngine(Engine):
    """A fake engine whose admitting step makes only the prompt's first token, as vLLM's does (the
    torch engine's also decodes a second); it notes how many join at each step that admits."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.waiting: list = []
        self.running: dict[str, list] = {}  # id -> [request, tokens made]
        self.admitted: list[int] = []

    def add_request(self, request):
        self.waiting.append(request)

    def abort(self, request_ids):
        ids = set(request_ids)
        self.waiting = [r for r in self.waiting if r.request_id not in ids]
        self.running = {k: v for k, v in self.running.items() if k not in ids}

    def step(self):
        for r in self.running.values():
            r[1] += 1
        joining = self.waiting[:self.capacity - len(self.running)]
        if self.waiting:
            self.admitted.append((len(self.waiting), len(joining)))
        self.waiting = self.waiting[len(joining):]
        self.running.update((r.request_id, [r, 1]) for r in joining)
        done = [k for k, (r, n) in self.running.items() if n >= r.max_new_tokens]
        for k in done:
            del self.running[k]
        return [Completion(k, (5,), (-1.0,), "length", 0, 0.0, 0.0) for k in done]

    def has_unfinished(self):
        return bool(self.waiting or self.running)

    def stats(self):
        return EngineStats(len(self.running), len(self.waiting), 0, self.capacity)

    def set_batch_cap(self, max_batch_size): ...
    def hold_admission(self, held): ...
    def measure_latency(self, batch_sizes, steps=4, context=None): ...
    def latency_profile(self): ...
    def pause_generation(self): ...
    def start_weight_update(self): ...
    def update_weights(self, named_tensors): ...
    def finish_weight_update(self, policy_version): ...
    def resume_generation(self): ...


def test_each_timed_step_admits_all_its_prompts_on_an_engine_that_admits_with_one_token():
    """vLLM's admitting step makes one token: prompts left running into the next round held the
    batch full there, the next round's prompts waited a step, and the profile priced prefill at 0."""
    engine = _OneTokenAdmissionEngine(capacity=4)
    _admission_s(engine, prompts=2, prompt_tokens=4, rounds=3)
    # The running batch joins, then a warm-up and 3 rounds of 2, each whole at its timed step
    assert engine.admitted == [(2, 2)] * 5
    assert not engine.has_unfinished()


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

