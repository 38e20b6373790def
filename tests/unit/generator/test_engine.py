import pytest
import torch

from streamrl.generator.engine import GenerationRequest
from streamrl.generator.torch_engine import TorchEngine
from streamrl.models import load_model, load_tokenizer

PROMPTS = ["1..5:", "12..40:", "3+4=", "99..99:", "a", "hello world", "7..9:", "123+456="]


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    return load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)


def _requests(tok, temperature=0.0, max_new=lambda i: 12 + 5 * i):
    for i, text in enumerate(PROMPTS):
        ids = (tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"])
        yield GenerationRequest(str(i), ids, max_new(i), temperature, 1.0, seed=100 + i)


def run_requests(engine, requests):
    """Every request through `engine` to its end: request id -> its one Completion."""
    for r in requests:
        engine.add_request(r)
    out = {}
    while engine.has_unfinished():
        for c in engine.step():
            assert c.request_id not in out
            out[c.request_id] = c
    return out


def test_continuous_batching_equals_sequential_greedy(model_and_tok):
    model, tok = model_and_tok
    batched = run_requests(TorchEngine(model, 3, tok.eos_token_id), _requests(tok))
    one_by_one = {}
    for r in _requests(tok):
        one_by_one.update(run_requests(TorchEngine(model, 1, tok.eos_token_id), [r]))
    assert set(batched) == {str(i) for i in range(len(PROMPTS))}
    for rid, c in batched.items():
        assert c.token_ids == one_by_one[rid].token_ids
        assert c.logprobs == pytest.approx(one_by_one[rid].logprobs, abs=1e-4)


def test_greedy_matches_hf_generate_and_logprobs_match_a_full_forward(model_and_tok):
    model, tok = model_and_tok
    out = run_requests(TorchEngine(model, 4, tok.eos_token_id), _requests(tok))
    for r in _requests(tok):
        ref = model.generate(torch.tensor([r.prompt_token_ids]), max_new_tokens=r.max_new_tokens, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        got = out[r.request_id]
        assert got.token_ids == tuple(ref[0, len(r.prompt_token_ids):].tolist())
        full = torch.tensor([list(r.prompt_token_ids) + list(got.token_ids)])
        with torch.no_grad():
            logits = model(full).logits[0, len(r.prompt_token_ids) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, full[0, len(r.prompt_token_ids):, None])[:, 0]
        assert list(got.logprobs) == pytest.approx(expected.tolist(), abs=1e-4)
        assert got.finish_reason == ("stop" if got.token_ids[-1] == tok.eos_token_id else "length")


def test_sampling_is_reproducible_whatever_the_batch(model_and_tok):
    model, tok = model_and_tok
    a = run_requests(TorchEngine(model, 8, tok.eos_token_id), _requests(tok, temperature=1.0))
    b = run_requests(TorchEngine(model, 2, tok.eos_token_id), _requests(tok, temperature=1.0))
    assert {k: v.token_ids for k, v in a.items()} == {k: v.token_ids for k, v in b.items()}
    greedy = run_requests(TorchEngine(model, 8, tok.eos_token_id), _requests(tok))
    assert any(a[k].token_ids != greedy[k].token_ids for k in a)


def test_top_p_keeps_only_the_nucleus(model_and_tok):
    model, tok = model_and_tok
    tiny_p = list(_requests(tok, temperature=1.0))
    tiny_p = [GenerationRequest(r.request_id, r.prompt_token_ids, r.max_new_tokens, 1.0, 1e-6, r.seed) for r in tiny_p]
    sampled = run_requests(TorchEngine(model, 8, tok.eos_token_id), tiny_p)
    greedy = run_requests(TorchEngine(model, 8, tok.eos_token_id), _requests(tok))
    assert {k: v.token_ids for k, v in sampled.items()} == {k: v.token_ids for k, v in greedy.items()}


def test_priority_admits_higher_first(model_and_tok):
    model, tok = model_and_tok
    engine = TorchEngine(model, 1, tok.eos_token_id)
    for rid, prio in [("low", 0.0), ("high", 5.0), ("mid", 1.0)]:
        engine.add_request(GenerationRequest(rid, (tok.bos_token_id, 5), 1, 0.0, 1.0, 0, prio))
    order = [c.request_id for _ in range(3) for c in engine.step()]
    assert order == ["high", "mid", "low"]


def test_abort_removes_waiting_and_running(model_and_tok):
    model, tok = model_and_tok
    engine = TorchEngine(model, 2, tok.eos_token_id)
    reqs = list(_requests(tok, max_new=lambda i: 50))
    for r in reqs[:4]:
        engine.add_request(r)
    engine.step()
    assert engine.stats().num_running == 2 and engine.stats().num_waiting == 2
    engine.abort(["0", "2"])
    assert engine.stats().num_running == 1 and engine.stats().num_waiting == 1
    done = {}
    while engine.has_unfinished():
        done.update({c.request_id: c for c in engine.step()})
    assert set(done) == {"1", "3"}


def test_weight_update_follows_the_vllm_sequence(model_and_tok, tiny_model_dir):
    model, tok = model_and_tok
    engine = TorchEngine(load_model(tiny_model_dir), 2, tok.eos_token_id)
    new = {k: torch.zeros_like(v) for k, v in model.named_parameters()}
    with pytest.raises(RuntimeError, match="pause_generation first"):
        engine.start_weight_update()
    engine.pause_generation()
    engine.start_weight_update()
    with pytest.raises(ValueError, match="unknown parameter 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))])
    engine.update_weights(list(new.items())[:3])
    with pytest.raises(ValueError, match="lacks"):
        engine.finish_weight_update(1)
    engine.update_weights(new.items())
    engine.finish_weight_update(7)
    engine.add_request(next(_requests(tok)))
    assert engine.step() == []  # paused: nothing runs
    engine.resume_generation()
    assert engine.policy_version == 7
    assert all(float(p.detach().abs().sum()) == 0 for p in engine.model.parameters())
    while engine.has_unfinished():
        for c in engine.step():
            assert c.policy_version == 7


def test_without_an_eos_every_request_runs_to_its_max_new_tokens(model_and_tok):
    model, tok = model_and_tok
    said = run_requests(TorchEngine(model, 8, tok.eos_token_id), _requests(tok))["1"].token_ids
    stopped = run_requests(TorchEngine(model, 8, said[2]), _requests(tok))  # a token it says ends its sequences
    assert stopped["1"].finish_reason == "stop" and stopped["1"].token_ids == said[:said.index(said[2]) + 1]
    free = run_requests(TorchEngine(model, 8, None), _requests(tok))
    assert {rid: (c.finish_reason, len(c.token_ids)) for rid, c in free.items()} == {
        r.request_id: ("length", r.max_new_tokens) for r in _requests(tok)}


def test_request_longer_than_the_context_is_refused(model_and_tok):
    model, tok = model_and_tok
    engine = TorchEngine(model, 2, tok.eos_token_id, max_len=32)
    with pytest.raises(ValueError, match="exceeds the context of 32"):
        engine.add_request(GenerationRequest("x", (1, 2, 3), 40))


def test_latency_profile_is_measured_and_grows_with_batch_size(model_and_tok):
    model, tok = model_and_tok
    engine = TorchEngine(model, 64, tok.eos_token_id)
    points = engine.measure_latency([1, 8, 64], steps=6)
    assert [b for b, _ in points] == [1, 8, 64]
    assert all(s > 0 for _, s in points)
    assert points[2][1] > points[0][1]  # a 64-wide decode step costs more than a 1-wide one
    assert engine.latency_profile() == points
    for r in _requests(tok):
        engine.add_request(r)
    while engine.has_unfinished():
        engine.step()
    seen = dict(engine.latency_profile())
    assert set(seen) >= {1, 8, 64} and all(s > 0 for s in seen.values())


def test_a_decode_step_is_timed_at_the_batch_size_it_decoded(model_and_tok):
    model, tok = model_and_tok
    engine = TorchEngine(model, 4, eos_token_id=-1)  # no EOS: each request decodes exactly max_new_tokens
    for i in range(3):
        engine.add_request(GenerationRequest(str(i), (1, 5, 6), 2))
    while engine.has_unfinished():
        engine.step()  # the step that finishes all three decoded three, not the none left after it
    assert [b for b, _ in engine.latency_profile()] == [3]


def test_latency_is_not_measured_while_running(model_and_tok):
    model, tok = model_and_tok
    engine = TorchEngine(model, 4, tok.eos_token_id)
    engine.add_request(next(_requests(tok)))
    engine.step()
    with pytest.raises(RuntimeError, match="idle engine"):
        engine.measure_latency([1])


def test_batch_cap_limits_how_many_decode_at_once(model_and_tok):
    model, tok = model_and_tok
    engine = TorchEngine(model, 8, tok.eos_token_id)
    engine.set_batch_cap(2)
    for r in _requests(tok, max_new=lambda i: 30):
        engine.add_request(r)
    engine.step()
    assert engine.stats().num_running == 2 and engine.stats().capacity == 2
    engine.set_batch_cap(0)  # back to full capacity
    engine.step()
    assert engine.stats().num_running == 8


def test_an_idle_engine_lends_its_kv_cache_and_takes_it_back_for_work(model_and_tok):
    """Colocated mode's switch: sleep() releases the cache only when idle; the next step with
    work allocates it again, and generation is what it was without sleeping."""
    model, tok = model_and_tok
    awake = run_requests(TorchEngine(model, 4, tok.eos_token_id), _requests(tok, temperature=1.0))
    engine = TorchEngine(model, 4, tok.eos_token_id)
    full = engine.decoder.cache_bytes
    assert full > 0
    engine.add_request(next(_requests(tok)))
    assert engine.sleep() is False and engine.decoder.cache_bytes == full  # work waits: nothing released
    engine.abort(["0"])
    assert engine.sleep() is True and engine.decoder.cache_bytes == 0
    assert engine.step() == [] and engine.decoder.released  # no work: stays asleep
    woken = run_requests(engine, _requests(tok, temperature=1.0))
    assert engine.decoder.cache_bytes == full
    assert {rid: c.token_ids for rid, c in woken.items()} == {rid: c.token_ids for rid, c in awake.items()}


def test_version_runs_are_run_length_and_empty_for_one_version():
    from streamrl.samples import VersionRun, version_runs

    assert version_runs([]) == () and version_runs([3, 3, 3]) == ()
    assert version_runs([3, 3, 4, 4, 4, 6]) == (VersionRun(3, 2), VersionRun(4, 3), VersionRun(6, 1))


def test_admission_held_keeps_waiting_requests_out_while_running_ones_go_on(model_and_tok):
    model, tok = model_and_tok
    engine = TorchEngine(model, 4, eos_token_id=-1)
    first, later = list(_requests(tok, max_new=lambda i: 6))[:2], list(_requests(tok, max_new=lambda i: 6))[2:4]
    for r in first:
        engine.add_request(r)
    engine.step()
    engine.hold_admission(True)
    for r in later:
        engine.add_request(r)
    done = []
    for _ in range(10):
        done += engine.step()
    assert sorted(c.request_id for c in done) == ["0", "1"]  # room for two more, yet they waited
    assert (engine.stats().num_running, engine.stats().num_waiting) == (0, 2)
    engine.hold_admission(False)
    assert sorted(run_requests(engine, [])) == ["2", "3"]
