"""The builders: every object passes Kubernetes's own schemas in strict mode, pools land
on the node pools and GPUs they name, user templates merge under the operator's part."""

from pathlib import Path

import kubernetes_validate
import pytest

from streamrl.operator.builders import (
    MAIN,
    build_children,
    build_generators,
    generator_selector,
    merge,
    owner_reference,
)
from streamrl.operator.settings import Settings
from streamrl.spec import API_VERSION, load_job, parse_job

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("rljob-*.yaml"))
BODY = {"apiVersion": API_VERSION, "kind": "RLJob",
        "metadata": {"name": "hetero-counting", "uid": "0b7c-uid"}}
OWNER = owner_reference(BODY)


def _children(path: Path, **kw) -> list[dict]:
    return build_children(load_job(path), "rl", Settings(), OWNER, **kw)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_object_validates_strictly(path):
    objects = _children(path)
    assert {o["kind"] for o in objects} >= {"ConfigMap", "Job", "Service", "Deployment"}
    for obj in objects:
        assert kubernetes_validate.validate(obj, "1.33", strict=True) == "1.33", obj["metadata"]["name"]
        assert obj["metadata"]["ownerReferences"] == [OWNER]
        assert obj["metadata"]["labels"]["streamrl.io/job"] == load_job(path).metadata.name
        assert obj["metadata"]["namespace"] == "rl"


def test_a_broken_object_is_caught_by_the_validator():
    [deployment] = [o for o in _children(ROOT / "deploy/examples/rljob-tiny-cpu.yaml") if o["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    with pytest.raises(kubernetes_validate.ValidationError, match="'gpus' was unexpected"):
        kubernetes_validate.validate(deployment, "1.33", strict=True)


def test_heterogeneous_pools_land_on_their_node_pools_with_their_gpus():
    children = _children(ROOT / "deploy/examples/rljob-heterogeneous.yaml")
    objects = {(o["kind"], o["metadata"]["name"]): o for o in children}
    expected = {
        ("Deployment", "hetero-counting-gen-l4"): ({"cloud.google.com/gke-accelerator": "nvidia-l4"}, 4),
        ("Deployment", "hetero-counting-gen-a10g"): ({"node.kubernetes.io/instance-type": "g5.2xlarge"}, 2),
        ("Job", "hetero-counting-trainer"): ({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, None),
    }
    for key, (node_selector, replicas) in expected.items():
        pod = objects[key]["spec"]["template"]["spec"]
        main = pod["containers"][0]
        assert pod["nodeSelector"] == node_selector
        assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert main["resources"]["requests"]["nvidia.com/gpu"] == 1
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        if replicas is not None:
            assert objects[key]["spec"]["replicas"] == replicas
            assert objects[key]["spec"]["selector"]["matchLabels"]["streamrl.io/pool"] == key[1].rsplit("-", 1)[1]
    l4 = objects[("Deployment", "hetero-counting-gen-l4")]["spec"]["template"]["spec"]["containers"][0]
    assert l4["resources"]["requests"]["cpu"] == "4"
    assert "--pool" in l4["args"] and l4["args"][l4["args"].index("--pool") + 1] == "l4"
    assert l4["args"][l4["args"].index("--trainer") + 1] == "hetero-counting-trainer.rl.svc:50051"
    # skewness-aware dispatch: the ranker comes along, and the trainer is told where.
    assert ("Deployment", "hetero-counting-ranker") in objects and ("Service", "hetero-counting-ranker") in objects
    trainer_args = objects[("Job", "hetero-counting-trainer")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert trainer_args[trainer_args.index("--ranker") + 1] == "hetero-counting-ranker:50052"


def test_remote_pools_are_not_built_locally_and_tls_is_mounted():
    objects = _children(ROOT / "deploy/examples/rljob-cross-dc.yaml")
    deployments = [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"]
    assert deployments == ["cross-dc-counting-gen-local"]
    [service] = [o for o in objects if o["kind"] == "Service"]
    assert service["spec"]["type"] == "LoadBalancer"
    job = load_job(ROOT / "deploy/examples/rljob-cross-dc.yaml")
    remote = build_generators(job, "west", "rl", Settings(), "203.0.113.7:50051",
                              origin={"streamrl.io/origin-cluster": "home", "streamrl.io/origin-namespace": "rl"})
    assert kubernetes_validate.validate(remote, "1.33", strict=True)
    assert "ownerReferences" not in remote["metadata"]  # cannot cross clusters: a finalizer removes it
    assert remote["metadata"]["labels"]["streamrl.io/origin-cluster"] == "home"
    pod = remote["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "cross-dc-tls"}} in pod["volumes"]
    assert {"name": "tls", "mountPath": "/etc/streamrl/tls", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert pod["containers"][0]["args"][pod["containers"][0]["args"].index("--trainer") + 1] == "203.0.113.7:50051"


def test_configmap_carries_the_spec_with_fixed_ports():
    objects = _children(ROOT / "deploy/examples/rljob-tiny-cpu.yaml")
    [cm] = [o for o in objects if o["kind"] == "ConfigMap"]
    loaded = parse_job(__import__("yaml").safe_load(cm["data"]["job.yaml"]))
    assert (loaded.spec.trainer.port, loaded.spec.trainer.admin_port) == (50051, 8080)
    assert loaded.spec.algorithm == load_job(ROOT / "deploy/examples/rljob-tiny-cpu.yaml").spec.algorithm


def test_user_template_merges_under_the_operator_part():
    job = parse_job({"metadata": {"name": "t"}, "spec": {"model": {"source": "builtin-tiny"},
                                                   "generators": {"pools": [{"name": "p", "placement": {
        "template": {"metadata": {"annotations": {"team": "rl"}},
                     "spec": {"serviceAccountName": "rl-sa", "priorityClassName": "high",
                              "containers": [{"name": MAIN, "env": [{"name": "HF_HOME", "value": "/hf"}],
                                              "args": ["ignored"]},
                                             {"name": "sidecar", "image": "busybox"}],
                              "volumes": [{"name": "hf", "emptyDir": {}}]}}}}]}}})
    deployment = build_generators(job, "p", "rl", Settings(), "t-trainer:50051")
    assert kubernetes_validate.validate(deployment, "1.33", strict=True)
    template = deployment["spec"]["template"]
    pod = template["spec"]
    assert template["metadata"]["annotations"] == {"team": "rl"}
    assert template["metadata"]["labels"]["streamrl.io/pool"] == "p"
    assert (pod["serviceAccountName"], pod["priorityClassName"]) == ("rl-sa", "high")
    main, sidecar = pod["containers"]
    assert main["args"][0] == "generator"  # the operator's command wins
    assert {"name": "HF_HOME", "value": "/hf"} in main["env"] and any(e["name"] == "POD_NAME" for e in main["env"])
    assert sidecar == {"name": "sidecar", "image": "busybox"}
    assert [v["name"] for v in pod["volumes"]] == ["hf", "job", "out", "cache"]


def test_merge_rules():
    assert merge({"a": 1, "b": {"c": 2}}, {"b": {"d": 3}}) == {"a": 1, "b": {"c": 2, "d": 3}}
    assert merge([{"name": "x", "v": 1}], [{"name": "x", "w": 2}, {"name": "y"}]) == \
        [{"name": "x", "v": 1, "w": 2}, {"name": "y"}]
    assert merge([1, 2], [3]) == [3]


def test_suspend_scales_to_zero_and_suspends_the_trainer():
    job = parse_job({"metadata": {"name": "s"}, "spec": {"model": {"source": "builtin-tiny"}, "suspend": True}})
    objects = build_children(job, "rl", Settings(), OWNER)
    assert [o["spec"]["replicas"] for o in objects if o["kind"] == "Deployment"] == [0]
    assert [o["spec"]["suspend"] for o in objects if o["kind"] == "Job"] == [True]


def test_total_replicas_are_spread_over_pools():
    job = parse_job({"metadata": {"name": "r"}, "spec": {"model": {"source": "builtin-tiny"}, "generators": {
        "replicas": 9, "pools": [{"name": "a", "replicas": 2}, {"name": "b", "replicas": 1}]}}})
    objects = build_children(job, "rl", Settings(), OWNER)
    assert {o["metadata"]["name"]: o["spec"]["replicas"] for o in objects if o["kind"] == "Deployment"} == \
        {"r-gen-a": 6, "r-gen-b": 3}
    assert generator_selector("r") == "streamrl.io/job=r,streamrl.io/role=generator"
