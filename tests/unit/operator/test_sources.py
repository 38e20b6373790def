"""The model reaches the trainer's pods only, as `streamrl render` shows it for each source:
hf through an init container filling the cache on the checkpoint claim (the token a file, in
those pods alone), a claim read-only, an image as a volume or copied by an init container;
generator pods mount no model. Every object stays valid and restricted. A failed model init
container is what the status says."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from streamrl.cli import main
from streamrl.operator.observe import pod_problems
from streamrl.operator.sources import HF_CACHE_MOUNT, HF_TOKEN_MOUNT, MODEL_MOUNT
from tests.k8stools import psa_restricted_problems

BASE = {"apiVersion": "streamrl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "grpo-7b"},
        "spec": {"checkpoint": {"volume": {"size": "100Gi"}}}}


def _render(tmp_path, capsys, model: dict) -> tuple[dict, list[dict]]:
    job = {**BASE, "spec": {**BASE["spec"], "model": model}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["render", str(path)]) == 0
    objects = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    for obj in objects:
        assert kubernetes_validate.validate(obj, "1.33", strict=True) == "1.33", obj["metadata"]["name"]
    [trainer] = [o for o in objects if o["kind"] == "Job"]
    pod = trainer["spec"]["template"]["spec"]
    assert psa_restricted_problems(pod) == []
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        gen = deployment["spec"]["template"]["spec"]
        assert not {"model", "hf-token"} & {v["name"] for v in gen["volumes"]}
        assert "initContainers" not in gen
        assert "--model-dir" not in gen["containers"][0]["args"]  # it boots from the trainer
    return pod, objects


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_hf_downloads_once_into_the_claim_by_an_init_container_and_the_trainer_reads_it_offline(tmp_path, capsys):
    pod, _ = _render(tmp_path, capsys, {"source": "hf", "hf": {"repo": "Qwen/Qwen2.5-7B", "revision": "v1",
                                                                "tokenSecret": "hub-token"}})
    [init] = pod["initContainers"]
    [main_c] = pod["containers"]
    assert init["name"] == "fetch" and init["args"] == ["fetch", "/etc/streamrl/job/job.yaml"]
    assert init["image"] == main_c["image"] and init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert _env(init)["HF_HUB_CACHE"] == _env(main_c)["HF_HUB_CACHE"] == "/var/lib/streamrl/out/hf-cache"
    assert "HF_HUB_OFFLINE" not in _env(init) and _env(main_c)["HF_HUB_OFFLINE"] == "1"
    assert _env(main_c)["HF_TOKEN_PATH"] == f"{HF_TOKEN_MOUNT}/token"
    assert not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"] for e in main_c["env"] + init["env"])
    [token] = [v for v in pod["volumes"] if v["name"] == "hf-token"]
    assert token["secret"]["secretName"] == "hub-token"
    assert "--model-dir" not in main_c["args"]  # it resolves the repository in the cache itself


def test_hf_without_a_checkpoint_claim_caches_on_a_claim_of_its_own(tmp_path, capsys):
    # N7: the download outlives the pod an eviction takes (an emptyDir went with it, and every
    # restart downloaded the model again).
    job = {**BASE, "spec": {"model": {"source": "hf", "hf": {"repo": "org/m"}}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["render", str(path)]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    [trainer] = [d for d in docs if d["kind"] == "Job"]
    [claim] = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    pod = trainer["spec"]["template"]["spec"]
    assert _env(pod["containers"][0])["HF_HUB_CACHE"] == HF_CACHE_MOUNT
    assert "hf-token" not in {v["name"] for v in pod["volumes"]}
    [cache] = [v for v in pod["volumes"] if v["name"] == "hf-cache"]
    assert cache["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
    for container in (pod["containers"][0], pod["initContainers"][0]):  # the download and its reader
        assert {"name": "hf-cache", "mountPath": HF_CACHE_MOUNT} in container["volumeMounts"]
        assert "ephemeral-storage" not in (container.get("resources") or {}).get("requests", {})
    assert claim["metadata"]["name"] == f"{job['metadata']['name']}-hf-cache"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "50Gi"}}}
    job["spec"]["model"]["hf"].update(cacheSize="160Gi", cacheStorageClass="fast")
    job["spec"]["trainer"] = {"nodes": 2}
    path.write_text(yaml.safe_dump(job))
    assert main(["render", str(path)]) == 0
    [claim] = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d and d["kind"] == "PersistentVolumeClaim"]
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "160Gi"}},
                             "storageClassName": "fast"}


def test_hf_on_a_checkpoint_claim_leaves_the_pods_disk_unbounded_and_unrequested(tmp_path, capsys):
    pod, _ = _render(tmp_path, capsys, {"source": "hf", "hf": {"repo": "org/m"}})
    [cache] = [v for v in pod["volumes"] if v["name"] == "cache"]
    assert cache["emptyDir"] == {}
    assert "ephemeral-storage" not in (pod["containers"][0].get("resources") or {}).get("requests", {})


def test_a_claim_is_mounted_read_only_and_named_to_the_trainer(tmp_path, capsys):
    pod, _ = _render(tmp_path, capsys, {"source": "pvc", "pvc": {"claimName": "models", "subPath": "qwen/7b"}})
    [volume] = [v for v in pod["volumes"] if v["name"] == "model"]
    assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    args = pod["containers"][0]["args"]
    assert args[args.index("--model-dir") + 1] == f"{MODEL_MOUNT}/qwen/7b"
    assert "initContainers" not in pod


@pytest.mark.parametrize("mount", ["volume", "copy"])
def test_an_image_is_a_volume_or_copied_by_an_init_container(tmp_path, capsys, mount):
    pod, _ = _render(tmp_path, capsys, {"source": "image", "image": {
        "reference": "registry.example.com/models/qwen:v1", "path": "model", "mount": mount}})
    [volume] = [v for v in pod["volumes"] if v["name"] == "model"]
    args = pod["containers"][0]["args"]
    if mount == "volume":
        assert volume["image"]["reference"] == "registry.example.com/models/qwen:v1"
        assert args[args.index("--model-dir") + 1] == f"{MODEL_MOUNT}/model"
    else:
        assert volume == {"name": "model", "emptyDir": {}}
        [init] = pod["initContainers"]
        assert init["image"] == "registry.example.com/models/qwen:v1"
        assert init["command"] == ["cp", "-R", "/model/.", MODEL_MOUNT]
        assert args[args.index("--model-dir") + 1] == MODEL_MOUNT


def test_a_failed_model_init_container_is_what_the_status_says():
    pod = {"metadata": {"name": "grpo-7b-trainer-0-x"}, "status": {"initContainerStatuses": [
        {"name": "fetch", "state": {"terminated": {"exitCode": 2, "reason": "Error", "message":
                                                   "fetching\nstreamrl fetch: model.hf.repo org/m: no such "
                                                   "repository (or it is private and no token was given)\n"}}}]}}
    assert pod_problems([pod], [], "grpo-7b") == [(
        "InitContainerFailed", "pod grpo-7b-trainer-0-x init container fetch exited with 2: streamrl fetch: "
        "model.hf.repo org/m: no such repository (or it is private and no token was given)")]


def test_a_task_file_on_a_claim_is_mounted_in_the_trainers_pods_and_named_by_its_path(tmp_path, capsys):
    job = {**BASE, "spec": {**BASE["spec"], "model": {"source": "builtin-tiny"},
                            "task": {"name": "jsonl", "pvc": {"claimName": "datasets", "path": "math/train.jsonl"}}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["render", str(path)]) == 0
    objects = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    [trainer] = [o for o in objects if o["kind"] == "Job"]
    pod = trainer["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "data"]
    assert volume["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
    [config] = [o for o in objects if o["kind"] == "ConfigMap"]
    loaded = yaml.safe_load(config["data"]["job.yaml"])["spec"]["task"]
    assert loaded["path"] == "/var/lib/streamrl/data/math/train.jsonl" and "pvc" not in loaded
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        assert "data" not in {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}


def test_a_copied_model_image_and_a_hub_task_file_run_two_init_containers_in_order(tmp_path, capsys):
    job = {**BASE, "spec": {**BASE["spec"], "model": {"source": "image", "image": {
        "reference": "r.example.com/m:v1", "mount": "copy"}}, "task": {"name": "jsonl", "hf": {
            "repo": "org/data", "file": "train.jsonl"}}}}
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["render", str(path)]) == 0
    [trainer] = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d and d["kind"] == "Job"]
    inits = trainer["spec"]["template"]["spec"]["initContainers"]
    assert [(c["name"], c["image"]) for c in inits] == [("model-copy", "r.example.com/m:v1"),
                                                         ("fetch", trainer["spec"]["template"]["spec"]
                                                          ["containers"][0]["image"])]


def test_two_hub_token_secrets_are_refused_naming_the_field(tmp_path, capsys):
    job = {**BASE, "spec": {**BASE["spec"], "model": {"source": "hf", "hf": {"repo": "o/m", "tokenSecret": "a"}},
                            "task": {"name": "jsonl", "hf": {"repo": "o/d", "file": "t.jsonl", "tokenSecret": "b"}}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["render", str(path)]) == 1
    assert "spec.task.hf.tokenSecret: a and b" in capsys.readouterr().err


def test_a_running_fetch_is_what_a_pending_job_says():
    from streamrl.operator.phases import JobPhase, Observed, _phase

    pod = {"metadata": {"name": "grpo-7b-trainer-0-x"}, "status": {"initContainerStatuses": [
        {"name": "fetch", "state": {"running": {"startedAt": "2026-12-05T08:00:00Z"}}}]}}
    problems = pod_problems([pod], [], "grpo-7b")
    assert problems == [("FetchingModel", "pod grpo-7b-trainer-0-x: init container fetch is putting the model and "
                                          "task file (from the Hugging Face Hub) in place, since 2026-12-05T08:00:00Z")]
    phase, message = _phase(Observed(generation=1, pod_problems=tuple(problems)))
    assert phase == JobPhase.PENDING and message.startswith("FetchingModel: pod grpo-7b-trainer-0-x: init container")
