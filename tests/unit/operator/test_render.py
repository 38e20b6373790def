"""`streamrl render`, as a user runs it: every object the operator creates for each example,
as YAML that kubernetes-validate accepts strictly, workload pods that pass Pod Security
"restricted", a NetworkPolicy around the trainer; names the API server could not make every
child from are refused with the field named, as `streamrl validate` refuses them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from streamrl.cli import main
from tests.k8stools import psa_restricted_problems, tool

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("rljob-*.yaml"))
WORKLOADS = {"Deployment", "Job"}


def _render(capsys, *args: str) -> tuple[int, list[dict], str]:
    code = main(["render", *args])
    out, err = capsys.readouterr()
    return code, [d for d in yaml.safe_load_all(out) if d], err


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_valid_objects_with_restricted_pods_and_a_fenced_trainer(path, capsys):
    code, objects, err = _render(capsys, str(path), "--namespace", "team-a")
    assert (code, err) == (0, "")
    kinds = {o["kind"] for o in objects}
    assert {"ConfigMap", "Secret", "NetworkPolicy", "Job", "Service", "Deployment"} <= kinds
    job = yaml.safe_load(path.read_text())["metadata"]["name"]
    for obj in objects:
        assert kubernetes_validate.validate(obj, "1.33", strict=True) == "1.33", obj["metadata"]["name"]
        assert obj["metadata"]["namespace"] == "team-a"
        assert "ownerReferences" not in obj["metadata"]  # no uid before the RLJob exists
        if obj["kind"] in WORKLOADS:
            assert psa_restricted_problems(obj["spec"]["template"]["spec"]) == [], obj["metadata"]["name"]
    [trainer] = [o for o in objects if o["kind"] == "Job"]
    trainer_labels = trainer["spec"]["template"]["metadata"]["labels"]
    fences = [p for p in objects if p["kind"] == "NetworkPolicy" and
              p["spec"]["podSelector"]["matchLabels"].items() <= trainer_labels.items()]
    assert fences and all(p["spec"]["policyTypes"] == ["Ingress"] for p in fences)
    assert fences[0]["metadata"]["name"] == f"{job}-job"


def test_remote_pools_render_as_what_their_cluster_gets(capsys):
    code, objects, _ = _render(capsys, str(ROOT / "deploy/examples/rljob-cross-dc.yaml"))
    assert code == 0
    remote = [o for o in objects if o["metadata"]["labels"].get("streamrl.io/origin-cluster")]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in remote) == [
        ("ConfigMap", "cross-dc-counting-spec"), ("Deployment", "cross-dc-counting-gen-west"),
        ("NetworkPolicy", "cross-dc-counting-job"), ("Secret", "cross-dc-counting-token")]


@pytest.mark.parametrize("name, ok", [("7b-grpo", False), ("a" * 49, True), ("a" * 50, False)])
def test_a_name_that_cannot_make_every_child_is_refused(name, ok, tmp_path, capsys):
    body = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    body["metadata"]["name"] = name
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(body))
    code, objects, err = _render(capsys, str(path))
    if ok:
        assert code == 0 and f"{name}-trainer-ranks" in {o["metadata"]["name"] for o in objects}
        assert max(len(o["metadata"]["name"]) for o in objects if o["kind"] == "Service") == 63
        return
    assert (code, objects) == (1, []), err
    assert f"{path}: metadata.name: {name!r} must be a DNS-1035 label of at most 49 characters" in err
    assert main(["validate", str(path)]) == 1
    assert f"metadata.name: {name!r} must be a DNS-1035 label" in capsys.readouterr().out  # validate says the same


def test_render_as_the_readme_runs_it_feeds_kubernetes_tools(tmp_path):
    """The exact command line, a relative path from the checkout, and kubectl's own reader (its
    kustomize, which needs no server) taking the output as Kubernetes objects."""
    env = dict(os.environ, STREAMRL_JOB_IMAGE="registry.example/streamrl:1.2.3")
    rendered = subprocess.run([sys.executable, "-m", "streamrl.cli", "render", "deploy/examples/rljob-tiny-cpu.yaml",
                               "-n", "rl"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    assert "registry.example/streamrl:1.2.3" in rendered.stdout  # the operator's settings, from the environment
    (tmp_path / "rendered.yaml").write_text(rendered.stdout)
    (tmp_path / "kustomization.yaml").write_text("resources: [rendered.yaml]\n")
    kubectl = subprocess.run([tool("kubectl"), "kustomize", str(tmp_path)], capture_output=True, text=True,
                             timeout=120)
    assert kubectl.returncode == 0, kubectl.stderr
    names = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(kubectl.stdout)}
    assert {("Job", "tiny-counting-trainer"), ("NetworkPolicy", "tiny-counting-job"),
            ("Secret", "tiny-counting-token"), ("Deployment", "tiny-counting-gen-default")} <= names


@pytest.mark.parametrize("queued", [True, False])
def test_a_job_queued_through_kueue_renders_every_gpu_holding_pod_at_zero(queued, tmp_path, capsys):
    """Generators and the ranker hold no GPU while Kueue has not admitted the trainer Job: a
    render (what the operator applies before admission) shows them at 0 replicas."""
    body = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    if queued:
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a-queue"}
    body["spec"]["generators"]["dispatch"] = {"policy": "skewness-aware"}  # a ranker as well
    path = tmp_path / "queued.yaml"
    path.write_text(yaml.safe_dump(body))
    code, objects, err = _render(capsys, str(path), "--namespace", "team-a")
    assert (code, err) == (0, "")
    replicas = {o["metadata"]["name"]: o["spec"]["replicas"] for o in objects if o["kind"] == "Deployment"}
    assert replicas == {"tiny-counting-gen-default": 0 if queued else 1, "tiny-counting-ranker": 0 if queued else 1}
    [trainer] = [o for o in objects if o["kind"] == "Job"]
    assert trainer["spec"]["suspend"] is queued  # Kueue un-suspends it on admission
