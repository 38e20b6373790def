"""Where the policy model comes from, resolved by the real code: a Hub repository found in
huggingface_hub's cache offline (by branch, tag or commit), refusals that name the field, and
the Kubernetes-only sources refused on this machine."""

import pytest
from pydantic import ValidationError

from streamrl.models import load_model, resolve_model_dir
from streamrl.spec import RLJobSpec
from tests.hfcache import cache_model

REPO = "streamrl-test/tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, tiny_model_dir):
    """An offline hub whose cache holds REPO at COMMIT as `main` and `v1`."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache_model(tiny_model_dir, cache, REPO, ("main", "v1"), COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def _spec(model: dict) -> RLJobSpec:
    return RLJobSpec.model_validate({"model": model})


@pytest.mark.parametrize("revision", ["main", "v1", COMMIT])
def test_an_hf_model_resolves_in_the_cache_and_loads_with_from_pretrained(hub_cache, revision):
    path = resolve_model_dir(_spec({"source": "hf", "hf": {"repo": REPO, "revision": revision}}), log=lambda _: None)
    assert path.name == COMMIT and (path / "config.json").is_file()
    assert load_model(path).config.hidden_size == 128


def test_an_hf_repository_or_revision_the_cache_lacks_is_refused_naming_it(hub_cache):
    with pytest.raises(ValueError, match=r"model\.hf other/model@main: not in the Hugging Face cache"):
        resolve_model_dir(_spec({"source": "hf", "hf": {"repo": "other/model"}}), log=lambda _: None)
    with pytest.raises(ValueError, match=r"model\.hf streamrl-test/tiny@v9"):
        resolve_model_dir(_spec({"source": "hf", "hf": {"repo": REPO, "revision": "v9"}}), log=lambda _: None)


@pytest.mark.parametrize("source, block", [("pvc", {"claimName": "models"}),
                                           ("image", {"reference": "registry.example.com/m:v1"})])
def test_kubernetes_only_sources_are_refused_on_this_machine(source, block):
    with pytest.raises(ValueError, match=rf"model\.source {source}: .*Kubernetes only.*source: path"):
        resolve_model_dir(_spec({"source": source, source: block}))


@pytest.mark.parametrize("model, field", [
    ({"source": "hf"}, "hf is required when source is 'hf'"),
    ({"source": "path", "path": "/m", "hf": {"repo": "a/b"}}, "hf is only used when source is 'hf'"),
    ({"source": "pvc", "pvc": {"claimName": "models", "subPath": "../etc"}}, r"model\.pvc\.subPath"),
    ({"source": "pvc", "pvc": {"claimName": "Models"}}, r"model\.pvc\.claimName"),
    ({"source": "hf", "hf": {"repo": "a/b/c"}}, "repo"),
    ({"source": "image", "image": {"reference": "r", "mount": "rsync"}}, "mount"),
])
def test_a_bad_source_is_refused_naming_the_field(model, field):
    with pytest.raises(ValidationError, match=field):
        _spec(model)


def test_fetch_model_prints_the_directory_or_says_why_not(hub_cache, tmp_path, capsys):
    from streamrl.cli import main

    job = tmp_path / "job.yaml"
    job.write_text(f"apiVersion: streamrl.io/v1alpha1\nkind: RLJob\nmetadata: {{name: j}}\n"
                   f"spec: {{model: {{source: hf, hf: {{repo: {REPO}}}}}}}\n")
    assert main(["fetch", str(job)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"snapshots/{COMMIT}")
    job.write_text(job.read_text().replace(REPO, "streamrl-test/absent"))
    assert main(["fetch", str(job)]) == 2
    assert "streamrl fetch: model.hf streamrl-test/absent@main: not in the Hugging Face cache" in \
        capsys.readouterr().err


def test_a_jsonl_task_file_from_a_hub_dataset_resolves_in_the_cache(hub_cache, tmp_path):
    from streamrl.spec import TaskSpec
    from streamrl.tasks import load_prompts

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n')
    cache_model(data, hub_cache, "streamrl-test/sums", kind="dataset")
    task = TaskSpec.model_validate({"name": "jsonl", "hf": {"repo": "streamrl-test/sums", "file": "train.jsonl"}})
    assert [(p.text, p.answer) for p in load_prompts(task)] == [("1+1=", "2"), ("2+2=", "4")]
    missing = TaskSpec.model_validate({"name": "jsonl", "hf": {"repo": "streamrl-test/sums", "file": "test.jsonl"}})
    with pytest.raises(ValueError, match=r"task\.hf"):
        load_prompts(missing)


def test_a_task_file_on_a_claim_is_refused_on_this_machine():
    from streamrl.spec import TaskSpec
    from streamrl.tasks import load_prompts

    task = TaskSpec.model_validate({"name": "jsonl", "pvc": {"claimName": "data", "path": "train.jsonl"}})
    with pytest.raises(ValueError, match=r"task\.pvc: .*Kubernetes only.*task\.path"):
        load_prompts(task)


@pytest.mark.parametrize("task, message", [
    ({"name": "jsonl"}, "path, hf or pvc is required when name is 'jsonl'"),
    ({"name": "jsonl", "path": "a.jsonl", "hf": {"repo": "o/d", "file": "a.jsonl"}}, "path and hf"),
    ({"name": "counting", "pvc": {"claimName": "data", "path": "a.jsonl"}}, "pvc is only used when name is 'jsonl'"),
    ({"name": "jsonl", "pvc": {"claimName": "data", "path": "/etc/passwd"}}, r"task\.pvc\.path"),
])
def test_a_bad_task_source_is_refused_naming_the_field(task, message):
    with pytest.raises(ValidationError, match=message):
        RLJobSpec.model_validate({"task": task})
