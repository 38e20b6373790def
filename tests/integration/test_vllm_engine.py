"""The vLLM engine for real (vLLM's CPU build, in process) with the built-in model: booted on dummy
weights and given its first version in place, it samples as the torch engine does on the same
weights, each version it loads in place samples as a fresh vLLM engine started on that version,
requests running through a load go on with the new weights (in-flight), an incomplete version is
refused, abort and priority hold.

One engine serves the whole module (starting one takes seconds); a test that changes its
version or EOS puts them back.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from streamrl.generator.engine import GenerationRequest, setup_engine
from streamrl.generator.torch_engine import TorchEngine
from streamrl.generator.vllm_engine import VERSIONS_PREFIX, versions_base
from streamrl.models import eos_token_id, load_model, load_tokenizer
from streamrl.spec import VllmEngineSpec
from tests.conftest import child_env
from tests.unit.generator.test_engine import run_requests as _run

SPEC = VllmEngineSpec(device="cpu", enforce_eager=True, max_num_seqs=8, cpu_kv_cache_gib=0.25)
PROMPTS = ["1..5:", "12..40:", "3+4=", "99..99:", "a", "hello world", "7..9:", "123+456="]
LOGPROB_TOL = 1e-4
"""float32 on both sides; vLLM's kernels (oneDNN GEMMs, its own attention) sum in another order
than torch's: measured differences are below 1e-6."""


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def kept() -> list:
    """Engines a test starts beside `engine`, kept until the module ends: vLLM tears down its
    process-wide parallel state when an engine is collected, which the other engine still uses
    (a generator process holds one engine; only tests hold two)."""
    return []


BOOTED: dict[str, object] = {}
"""What the module's engine was before its first version loaded."""


@pytest.fixture(scope="module")
def engine(tiny_model_dir, kept, model):
    """As a replica booting from the trainer starts: vLLM on dummy weights, then version 0 (the
    model's weights) loaded in place. Every test below runs on an engine that got its weights so;
    the fresh engines some tests start load theirs from files."""
    booted = setup_engine(SPEC, str(tiny_model_dir), "float32", eos_token_id(tiny_model_dir), weights=False)
    BOOTED.update(holds_weights=booted.holds_weights, policy_version=booted.policy_version)
    booted.load_weights(((n, p.detach()) for n, p in model.named_parameters()), 0)
    yield booted
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    kept.clear()
    cleanup_dist_env_and_memory()  # the test process's torch.distributed as it was before the module


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_model(tiny_model_dir)


def _requests(tok, temperature=0.0, max_new=lambda i: 12 + 5 * i, seed=100):
    out = []
    for i, text in enumerate(PROMPTS):
        ids = (tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"])
        out.append(GenerationRequest(str(i), ids, max_new(i), temperature, 1.0, seed=seed + i))
    return out


def _perturbed(model, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: p.detach() + 0.05 * torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def test_an_engine_booted_on_dummy_weights_holds_none_until_its_first_version(engine):
    assert BOOTED == {"holds_weights": False, "policy_version": 0}  # the worker gives it no work then
    assert engine.holds_weights


def test_greedy_samples_and_logprobs_equal_the_torch_engines(engine, model, tok):
    reference = TorchEngine(model, 8, tok.eos_token_id)
    # The untrained model never says EOS: one of its greedy tokens stands in, so both engines stop on it.
    eos = _run(reference, _requests(tok))["1"].token_ids[4]
    saved = engine.eos_token_id
    engine.eos_token_id = reference.eos_token_id = eos
    try:
        got, expected = _run(engine, _requests(tok)), _run(reference, _requests(tok))
    finally:
        engine.eos_token_id = saved
    assert set(got) == {str(i) for i in range(len(PROMPTS))}
    for rid, c in got.items():
        assert c.token_ids == expected[rid].token_ids, rid
        assert c.logprobs == pytest.approx(expected[rid].logprobs, abs=LOGPROB_TOL)
        assert c.finish_reason == expected[rid].finish_reason
        assert c.policy_version == engine.policy_version
    assert {c.finish_reason for c in got.values()} == {"stop", "length"}


def test_without_an_eos_every_request_runs_to_its_max_new_tokens(engine, tok):
    saved = engine.eos_token_id
    said = _run(engine, _requests(tok))["1"].token_ids
    engine.eos_token_id = said[2]  # a token it says
    try:
        stopped = _run(engine, _requests(tok))
        engine.eos_token_id = None
        free = _run(engine, _requests(tok))
    finally:
        engine.eos_token_id = saved
    assert stopped["1"].finish_reason == "stop" and stopped["1"].token_ids == said[:said.index(said[2]) + 1]
    assert {rid: (c.finish_reason, len(c.token_ids)) for rid, c in free.items()} == {
        r.request_id: ("length", r.max_new_tokens) for r in _requests(tok)}


def test_sampled_logprobs_are_those_of_the_tempered_distribution(engine, model, tok):
    """The trainer's ratio divides by the probability the token was drawn with: at temperature T,
    softmax(logits / T) (vLLM's processed logprobs), not the raw softmax(logits)."""
    temperature = 0.7
    got = _run(engine, _requests(tok, temperature=temperature, max_new=lambda i: 10))
    for r in _requests(tok, temperature=temperature, max_new=lambda i: 10):
        c = got[r.request_id]
        full = torch.tensor([list(r.prompt_token_ids) + list(c.token_ids)])
        with torch.no_grad():
            logits = model(full).logits[0, len(r.prompt_token_ids) - 1: -1]
        tempered = torch.log_softmax(logits / temperature, -1).gather(-1, full[0, len(r.prompt_token_ids):, None])
        assert list(c.logprobs) == pytest.approx(tempered[:, 0].tolist(), abs=LOGPROB_TOL)


def test_a_seeded_sample_is_the_same_whatever_else_runs(engine, tok):
    alone = _run(engine, [_requests(tok, temperature=1.0)[3]])["3"]
    batched = _run(engine, _requests(tok, temperature=1.0))["3"]
    assert alone.token_ids == batched.token_ids
    other_seed = _run(engine, _requests(tok, temperature=1.0, seed=7))["3"]
    assert other_seed.token_ids != alone.token_ids


def test_each_version_samples_as_a_fresh_engine_started_on_it(engine, model, tok, tmp_path, tiny_model_dir, kept):
    before = _run(engine, _requests(tok))  # the prompts' KV is in the prefix cache now
    v1 = _perturbed(model, seed=1)
    written = set(versions_base().glob(f"{VERSIONS_PREFIX}*"))
    engine.load_weights(v1.items(), 1)
    assert engine.policy_version == 1
    assert set(versions_base().glob(f"{VERSIONS_PREFIX}*")) == written  # the files go once loaded
    after = _run(engine, _requests(tok))
    assert any(after[rid].token_ids != before[rid].token_ids for rid in before)  # the new version is in use

    # A fresh engine started on version 1 written as a model directory.
    fresh_dir = tmp_path / "v1"
    shutil.copytree(tiny_model_dir, fresh_dir)
    fresh_model = load_model(tiny_model_dir)
    fresh_model.load_state_dict(v1, strict=False)
    fresh_model.save_pretrained(fresh_dir)
    fresh = setup_engine(SPEC, str(fresh_dir), "float32", eos_token_id(tiny_model_dir))
    kept.append(fresh)
    expected = _run(fresh, _requests(tok))
    for rid in before:
        assert after[rid].token_ids == expected[rid].token_ids, rid
        assert after[rid].logprobs == expected[rid].logprobs, rid  # the same kernels on the same weights
        assert after[rid].policy_version == 1

    # Version 0 again: its samples come back bit for bit (no KV of version 1 is reused).
    engine.load_weights(((n, p.detach()) for n, p in model.named_parameters()), 2)
    again = _run(engine, _requests(tok))
    for rid in before:
        assert (again[rid].token_ids, again[rid].logprobs) == (before[rid].token_ids, before[rid].logprobs)


def test_requests_running_through_a_load_go_on_with_the_new_weights_and_say_so(engine, model, tok, tiny_model_dir):
    """An in-flight update: requests paused mid-sequence keep their KV cache and go on with the
    new version. Each completion's version runs split where the load came, and its tokens are
    the torch engine's doing the same (greedy on the old weights, then on the new with the KV
    computed so far kept), which are not those of the old weights alone."""
    held = engine.policy_version
    old = {n: p.detach().clone() for n, p in model.named_parameters()}
    new = _perturbed(model, seed=3)
    requests = _requests(tok, max_new=lambda i: 40)
    try:
        for r in requests:
            engine.add_request(r)
        for _ in range(6):
            assert engine.step() == []
        assert engine.stats().num_running == len(requests)
        engine.load_weights(new.items(), held + 1)  # pause -> update -> resume, the requests kept
        got = _run(engine, [])
    finally:
        engine.load_weights(old.items(), held + 2)  # the module's engine as it was (a version of its own)
    switched, differs = 0, False
    for r in requests:
        c = got[r.request_id]
        first, then = c.version_runs
        assert (first.policy_version, then.policy_version, c.policy_version) == (held, held + 1, held)
        assert first.num_tokens >= 1 and then.num_tokens >= 1 and first.num_tokens + then.num_tokens == len(c.token_ids)
        reference = TorchEngine(load_model(tiny_model_dir), 1, tok.eos_token_id)
        reference.add_request(r)
        while reference.stats().num_generated_tokens < first.num_tokens:
            assert reference.step() == []
        old_only = _run(TorchEngine(load_model(tiny_model_dir), 1, tok.eos_token_id), [r])[r.request_id]
        reference.load_weights(new.items(), 1)
        expected = _run(reference, [])[r.request_id]
        assert c.token_ids == expected.token_ids, r.request_id
        assert c.logprobs == pytest.approx(expected.logprobs, abs=LOGPROB_TOL)
        assert [(v.policy_version, v.num_tokens) for v in expected.version_runs] == [
            (0, first.num_tokens), (1, then.num_tokens)]
        assert c.token_ids[:first.num_tokens] == old_only.token_ids[:first.num_tokens]
        switched += 1
        differs |= c.token_ids != old_only.token_ids
    assert switched == len(requests) and differs  # the tokens after the load are the new weights'


def test_a_version_read_from_files_samples_as_the_same_version_handed_over(engine, model, tok):
    """Workers in vLLM's own processes (tensor parallel) read each version from files; the one worker
    in process takes the tensors as they are. Both load the same weights."""
    v3 = _perturbed(model, seed=3)
    engine.load_weights(v3.items(), 3)
    handed = _run(engine, _requests(tok))
    written = set(versions_base().glob(f"{VERSIONS_PREFIX}*"))
    engine._workers_in_process = False  # as with workers in other processes
    try:
        engine.load_weights(v3.items(), 4)
    finally:
        engine._workers_in_process = True
    from_files = _run(engine, _requests(tok))
    assert set(versions_base().glob(f"{VERSIONS_PREFIX}*")) == written  # the files go once loaded
    for rid, c in handed.items():
        assert (from_files[rid].token_ids, from_files[rid].logprobs) == (c.token_ids, c.logprobs), rid
    engine.load_weights(((n, p.detach()) for n, p in model.named_parameters()), 5)  # the module's weights back


def test_a_version_missing_a_parameter_is_refused_and_the_held_one_kept(engine, model, tok):
    held, before = engine.policy_version, _run(engine, _requests(tok))
    partial = _perturbed(model, seed=2)
    del partial["model.layers.1.mlp.down_proj.weight"]
    with pytest.raises(ValueError, match=r"weight update for version 9 lacks 1 parameter\(s\): "
                                         r"model.layers.1.mlp.down_proj.weight; it is not loaded"):
        engine.load_weights(partial.items(), 9)
    engine.resume_generation()  # load_weights stopped at the refusal, paused
    assert engine.policy_version == held
    after = _run(engine, _requests(tok))
    assert {rid: c.token_ids for rid, c in after.items()} == {rid: c.token_ids for rid, c in before.items()}
    with pytest.raises(ValueError, match="weight update names an unknown parameter 'lm_head.bias'"):
        engine.load_weights([("lm_head.bias", torch.zeros(3))], 9)
    engine.resume_generation()


def test_abort_drops_waiting_and_running_requests(engine, tok):
    requests = _requests(tok, max_new=lambda i: 30)
    engine.set_batch_cap(4)
    try:
        for r in requests:
            engine.add_request(r)
        engine.step()  # 0-3 run, 4-7 wait
        assert (engine.stats().num_running, engine.stats().num_waiting) == (4, 4)
        assert 0 < engine.stats().kv_cache_usage < 0.5
        engine.abort(["1", "6", "unknown"])
        out = {}
        while engine.has_unfinished():
            out.update((c.request_id, c) for c in engine.step())
    finally:
        engine.set_batch_cap(0)
    assert set(out) == {"0", "2", "3", "4", "5", "7"}
    assert all(len(c.token_ids) == 30 for c in out.values())


def test_higher_priority_is_admitted_first(engine, tok):
    ids = (tok.bos_token_id, 5, 6)
    engine.set_batch_cap(1)
    try:
        for rid, priority in [("low", 1.0), ("high", 40.0), ("mid", 12.5), ("mid-later", 12.5)]:
            engine.add_request(GenerationRequest(rid, ids, 3, 0.0, 1.0, priority=priority))
        order = []
        while engine.has_unfinished():
            order += [c.request_id for c in engine.step()]
    finally:
        engine.set_batch_cap(0)
    assert order == ["high", "mid", "mid-later", "low"]


def test_measure_latency_times_steps_and_leaves_the_engine_idle(engine):
    tokens = engine.stats().num_generated_tokens
    points = engine.measure_latency([1, 4, 8], steps=3)
    assert [bs for bs, _ in points] == [1, 4, 8]
    assert all(0 < seconds < 1 for _, seconds in points)
    assert not engine.has_unfinished() and engine.stats().num_generated_tokens == tokens
    assert [bs for bs, _ in engine.latency_profile()][:1] == [1]


def test_measure_latency_says_when_the_kv_cache_holds_fewer_sequences_than_the_batch(tiny_model_dir, kept):
    """vLLM's CPU KV cache is in blocks of 128 tokens, one held back: 0.5 MiB holds 4, so 3 sequences
    decode at once and the 4th waits for one to end."""
    small = setup_engine(VllmEngineSpec(device="cpu", enforce_eager=True, max_num_seqs=4, cpu_kv_cache_gib=0.5 / 1024),
                         str(tiny_model_dir), "float32", eos_token_id(tiny_model_dir))
    kept.append(small)
    with pytest.raises(RuntimeError, match="at batch 4: vLLM decoded only 3 of its sequences at once; its KV cache "
                                           "holds fewer than the pool's maxNumSeqs"):
        small.measure_latency([4], steps=2)
    assert not small.has_unfinished()


KEEPS_THREADS = """
import sys, torch
from streamrl import compute
from streamrl.generator.engine import setup_engine
from streamrl.models import load_model
from streamrl.spec import VllmEngineSpec

compute.set_threads(2)


def serve():
    spec = VllmEngineSpec(device="cpu", enforce_eager=True, max_num_seqs=2, cpu_kv_cache_gib=0.1)
    engine = setup_engine(spec, sys.argv[1], "bfloat16", 2, threads=2)
    started = torch.get_num_threads()
    engine.load_weights(load_model(sys.argv[1], "bfloat16").named_parameters(), 1)
    return started, torch.get_num_threads()


print(*compute.run(serve), torch.get_num_threads())
"""


def test_a_bfloat16_engine_keeps_the_engine_threads_openmp_threads(tiny_model_dir):
    """vLLM's CPU build packs a small bfloat16 GEMM (the tiny model's output head) with a kernel that
    leaves the calling thread at one OpenMP thread, at start-up and at every reload: a replica given
    two cores decoded on one. Its engine thread keeps its two; every other thread keeps one."""
    proc = subprocess.run([sys.executable, "-c", KEEPS_THREADS, str(tiny_model_dir)], capture_output=True, text=True,
                          env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["2", "2", "1"]  # after start-up, after a reload; the main thread
