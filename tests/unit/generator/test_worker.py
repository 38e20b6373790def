"""The engine thread's side of a reconnect, on a real tiny engine: every sample carries the
incarnation of the work it answers; Abandon drops a broken stream's work, running and
deferred, and nothing of it is emitted afterwards; work waits while the engine holds weights
newer than its trainer's, until a rollback load brings the trainer's version. Calls submitted
to the worker (the process's other torch work) run on the engine thread, between steps."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from streamrl.generator.torch_engine import TorchEngine
from streamrl.generator.worker import Abandon, LoadWeights, TrainerVersion, Worker
from streamrl.messages import Work
from streamrl.metrics import ServiceMetrics
from streamrl.models import load_model
from streamrl.samples import Sample, VersionRun


@pytest.fixture
def worker(tiny_model_dir):
    # No token is EOS: every sample runs to max_new_tokens, so lengths are known.
    engine = TorchEngine(load_model(tiny_model_dir), max_batch_size=4, eos_token_id=-1)
    samples: list[Sample] = []
    w = Worker(engine, "g0", ServiceMetrics("generator"), on_sample=samples.append)
    thread = threading.Thread(target=w.run, name="engine-under-test", daemon=True)
    thread.start()
    yield w, samples
    w.stop()
    thread.join(10)
    assert not thread.is_alive()


def _work(prompt_id: str, n: int, max_new: int = 4, incarnation: int = 0, min_version: int = 0) -> Work:
    return Work(prompt_id=prompt_id, prompt_token_ids=(1, 5, 6), sample_indices=tuple(range(n)), temperature=1.0,
                top_p=1.0, max_new_tokens=max_new, seed=3, min_policy_version=min_version, incarnation=incarnation)


def _wait(cond, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_samples_carry_the_incarnation_of_the_work_they_answer(worker):
    w, samples = worker
    w.inbox.put(_work("old", 2, incarnation=3))
    w.inbox.put(_work("new", 2, incarnation=4))
    _wait(lambda: len(samples) == 4, "4 samples")
    assert sorted((s.prompt_id, s.sample_index, s.incarnation) for s in samples) == [
        ("new", 0, 4), ("new", 1, 4), ("old", 0, 3), ("old", 1, 3)]


def test_abandon_drops_running_and_deferred_work_and_none_of_it_is_emitted_after(worker):
    w, samples = worker
    w.inbox.put(_work("long", 3, max_new=200))
    w.inbox.put(_work("later", 2, min_version=5))  # deferred: the engine holds v0
    _wait(lambda: w.engine.stats().num_running == 3, "the long samples to run")
    dropped: list[int] = []
    w.inbox.put(Abandon(dropped.append))
    _wait(lambda: dropped, "Abandon to be handled")
    emitted = len(samples)
    assert dropped[0] + emitted == 5 and dropped[0] >= 2  # the deferred two at least, and what still ran
    assert not w.engine.has_unfinished()
    time.sleep(0.5)
    assert len(samples) == emitted  # nothing of the abandoned work comes out afterwards
    w.inbox.put(_work("fresh", 1))  # the engine serves on
    _wait(lambda: any(s.prompt_id == "fresh" for s in samples), "the fresh sample")


def test_work_waits_while_the_engine_is_ahead_of_its_trainer_until_a_rollback_load(worker):
    w, samples = worker
    weights = {k: v.detach().clone() for k, v in w.engine.model.named_parameters()}
    w.inbox.put(LoadWeights(2, weights, time.monotonic()))
    _wait(lambda: w.engine.policy_version == 2, "v2 loaded")
    w.inbox.put(TrainerVersion(1))  # a restarted trainer that resumed at v1
    w.inbox.put(_work("p", 2))
    time.sleep(0.5)
    assert samples == []  # not generated with weights the trainer never had
    w.inbox.put(LoadWeights(1, weights, time.monotonic()))  # an older version, not a rollback: ignored
    time.sleep(0.3)
    assert w.engine.policy_version == 2 and samples == []
    changed = {k: v + 0.01 for k, v in weights.items()}
    w.inbox.put(LoadWeights(1, changed, time.monotonic(), rollback=True))
    _wait(lambda: len(samples) == 2, "the held work to run on v1")
    assert w.engine.policy_version == 1 and {s.policy_version for s in samples} == {1}
    params = dict(w.engine.model.named_parameters())
    assert all(torch.equal(params[k], t) for k, t in changed.items())


def test_the_same_version_with_other_weights_is_loaded_only_as_a_replacement(worker):
    w, _ = worker
    weights = {k: v.detach().clone() for k, v in w.engine.model.named_parameters()}
    w.inbox.put(LoadWeights(3, weights, time.monotonic()))
    _wait(lambda: w.engine.policy_version == 3, "v3 loaded")
    other = {k: v + 0.02 for k, v in weights.items()}
    w.inbox.put(LoadWeights(3, other, time.monotonic()))  # the same number, no replacement: ignored
    time.sleep(0.3)
    params = dict(w.engine.model.named_parameters())
    assert all(torch.equal(params[k], t) for k, t in weights.items())
    w.inbox.put(LoadWeights(3, other, time.monotonic(), replace=True))  # a resumed trainer's own v3
    _wait(lambda: all(torch.equal(dict(w.engine.model.named_parameters())[k], t) for k, t in other.items()),
          "the resumed trainer's v3 loaded")
    assert w.engine.policy_version == 3


def test_calls_run_on_the_engine_thread_between_steps(worker):
    w, samples = worker
    w.inbox.put(_work("p", 4, max_new=30))
    _wait(lambda: w.engine.stats().num_running == 4, "4 running sequences")
    tokens = w.submit(lambda: w.engine.stats().num_generated_tokens).result(10)
    seen = w.submit(lambda: (threading.current_thread().name, w.engine.stats().num_generated_tokens)).result(10)
    assert seen[0] == "engine-under-test"
    assert seen[1] > tokens  # the engine stepped in between: the calls did not stop it
    _wait(lambda: len(samples) == 4, "4 samples")
    assert all(len(s.completion_token_ids) == 30 for s in samples)


def test_a_failing_call_hands_its_error_back_and_the_engine_goes_on(worker):
    w, samples = worker

    def fails():
        raise ValueError("inside the call")

    with pytest.raises(ValueError, match="inside the call"):
        w.submit(fails).result(10)
    w.inbox.put(_work("p", 2))
    _wait(lambda: len(samples) == 2, "2 samples after the failed call")
    assert w.submit(lambda x, y: x + y, 2, y=3).result(10) == 5


def test_after_stop_calls_are_refused_and_queued_ones_fail(tiny_model_dir):
    engine = TorchEngine(load_model(tiny_model_dir), max_batch_size=4, eos_token_id=-1)
    w = Worker(engine, "g0", ServiceMetrics("generator"), on_sample=lambda s: None)
    w.stop()
    queued = w.submit(lambda: "never")  # behind the StopWorker
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="engine thread stopped"):
        queued.result(1)
    with pytest.raises(RuntimeError, match="g0: the engine thread has stopped"):
        w.submit(lambda: "late")


def test_a_replica_booted_from_the_trainer_takes_no_work_before_its_first_version(tiny_model_dir):
    from streamrl.generator.engine import setup_engine
    from streamrl.spec import TorchEngineSpec

    engine = setup_engine(TorchEngineSpec(max_batch_size=4), str(tiny_model_dir), "float32", -1,
                          weights=False)
    assert not engine.holds_weights and engine.policy_version == 0
    samples: list[Sample] = []
    w = Worker(engine, "g0", ServiceMetrics("generator"), on_sample=samples.append)
    thread = threading.Thread(target=w.run, name="engine-under-test", daemon=True)
    thread.start()
    try:
        w.inbox.put(_work("p", 2))  # min version 0, which its zero weights are not
        time.sleep(0.5)
        assert samples == [] and engine.stats().num_running == 0
        real = {k: v.detach().clone() for k, v in load_model(tiny_model_dir).named_parameters()}
        w.inbox.put(LoadWeights(0, real, time.monotonic()))  # v0 over "v0": loaded all the same
        _wait(lambda: len(samples) == 2, "the held work to run once v0 is in")
        assert engine.holds_weights
        params = dict(engine.model.named_parameters())
        assert all(torch.equal(params[k], t) for k, t in real.items())
    finally:
        w.stop()
        thread.join(10)


@pytest.fixture
def updating(tiny_model_dir):
    """start(in_flight) -> (worker, samples, loads): a worker on a tiny engine of 4 slots whose
    every load notes (version, tokens generated so far) on the engine thread, before the next step."""
    started: list[tuple[Worker, threading.Thread]] = []

    def start(in_flight: bool):
        engine = TorchEngine(load_model(tiny_model_dir), max_batch_size=4, eos_token_id=-1)
        samples: list[Sample] = []
        loads: list[tuple[int, int, int]] = []  # (version, tokens generated, samples emitted) at the load
        w = Worker(engine, "g0", ServiceMetrics("generator"), on_sample=samples.append, in_flight_updates=in_flight,
                   on_loaded=lambda msg, _: loads.append((msg.policy_version, engine.stats().num_generated_tokens,
                                                          len(samples))))
        thread = threading.Thread(target=w.run, name="engine-under-test", daemon=True)
        thread.start()
        started.append((w, thread))
        return w, samples, loads

    yield start
    for w, thread in started:
        w.stop()
        thread.join(10)


def _other_weights(engine: TorchEngine, shift: float) -> dict[str, torch.Tensor]:
    return {k: v.detach() + shift for k, v in engine.model.named_parameters()}


def test_drain_then_update_loads_a_version_once_the_running_requests_finish(updating):
    w, samples, loads = updating(in_flight=False)
    w.inbox.put(_work("old", 2, max_new=240))
    _wait(lambda: w.engine.stats().num_running == 2, "the old samples to run")
    w.inbox.put(LoadWeights(1, _other_weights(w.engine, 0.01), time.monotonic()))
    w.inbox.put(_work("new", 2, max_new=5))  # room for it in the batch, yet it waits for v1
    w.inbox.put(LoadWeights(2, _other_weights(w.engine, 0.02), time.monotonic()))  # overtakes v1 while it waits
    _wait(lambda: len(samples) == 4, "4 samples")
    assert [(v, emitted) for v, _, emitted in loads] == [(2, 2)]  # the newest only, once both old samples were out
    by_prompt = {(s.prompt_id, s.sample_index): s for s in samples}
    for i in range(2):
        old, new = by_prompt["old", i], by_prompt["new", i]
        assert (old.policy_version, old.version_runs, len(old.completion_token_ids)) == (0, (), 240)
        assert (new.policy_version, new.version_runs, len(new.completion_token_ids)) == (2, (), 5)
    assert w.engine.policy_version == 2
    w.inbox.put(LoadWeights(3, _other_weights(w.engine, 0.0), time.monotonic()))  # nothing runs: loaded at once
    _wait(lambda: w.engine.policy_version == 3, "v3 loaded")
    w.inbox.put(_work("after", 1, max_new=3))
    _wait(lambda: len(samples) == 5, "a sample after the drain")  # admission is open again
    assert samples[-1].policy_version == 3


def test_in_flight_update_loads_at_once_and_the_running_samples_carry_both_versions(updating):
    w, samples, loads = updating(in_flight=True)
    w.inbox.put(_work("p", 4, max_new=240))  # 4 slots: all admitted together, one token each per step
    _wait(lambda: w.engine.stats().num_running == 4, "4 running samples")
    w.inbox.put(LoadWeights(1, _other_weights(w.engine, 0.01), time.monotonic()))
    _wait(lambda: len(samples) == 4, "4 samples")
    [(version, generated, emitted)] = loads
    assert (version, emitted) == (1, 0)  # loaded while all four ran
    before = generated // 4  # tokens each had when v1 came in
    assert generated % 4 == 0 and 0 < before < 240
    for s in samples:
        assert s.policy_version == 0  # its oldest token's: staleness counts from it
        assert s.version_runs == (VersionRun(0, before), VersionRun(1, 240 - before))
        assert (s.num_versions, s.newest_version) == (2, 1)
