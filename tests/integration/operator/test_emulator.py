"""The emulator behaves as a real API server where kmock alone did not, and where the
difference hid operator bugs (emulator.py lists the rules): each rule is checked here through
the operator's own client, so a test of the operator that passes on the emulator means what it
would mean on a cluster."""

from __future__ import annotations

import pytest

from streamrl.operator.kube import KubeClient, KubeError, path_for, path_of
from streamrl.spec import API_VERSION

NS = "rl"


@pytest.fixture
async def kube(k8s):
    client = KubeClient(str(k8s.url))
    yield client
    await client.close()


def _deployment(**spec) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": NS,
                                                                      "labels": {"app": "x"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "x"}},
                     "template": {"metadata": {"labels": {"app": "x"}},
                                  "spec": {"containers": [{"name": "main", "image": "i"}], **spec}}}}


async def test_names_the_api_server_refuses_are_refused(kube):
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": NS},
               "spec": {"ports": [{"port": 1}]}}
    for bad in ("7b-grpo-trainer", "llama.sft-trainer", "x" * 64):
        with pytest.raises(KubeError) as err:
            await kube.apply({**service, "metadata": {**service["metadata"], "name": bad}})
        assert (err.value.status, err.value.reason) == (422, "Invalid") and "DNS-1035" in err.value.message
    ok = await kube.apply({**service, "metadata": {**service["metadata"], "name": "grpo-7b-trainer"}})
    assert ok["metadata"]["name"] == "grpo-7b-trainer"
    bad_label = _deployment()
    bad_label["metadata"]["labels"]["team"] = "a b"
    with pytest.raises(KubeError, match="label value"):
        await kube.create(bad_label)


async def test_server_side_apply_removes_what_the_manager_stopped_applying_and_keeps_others_fields(k8s, kube):
    first = _deployment(nodeSelector={"cloud.google.com/gke-accelerator": "nvidia-l4"})
    first["spec"]["template"]["metadata"]["annotations"] = {"a": "1"}
    created = await kube.apply(first)
    assert created["metadata"]["generation"] == 1
    # Another writer (the cluster, a user) adds a field the operator never applied.
    await kube.patch(path_for(first), {"metadata": {"annotations": {"deployment.kubernetes.io/revision": "1"}}})
    second = _deployment(nodeSelector={"node.kubernetes.io/instance-type": "g5.2xlarge"})
    result = await kube.apply(second)
    pod = result["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"node.kubernetes.io/instance-type": "g5.2xlarge"}  # not both selectors
    assert "annotations" not in pod["metadata"]  # removed with the operator's apply
    assert result["metadata"]["annotations"] == {"deployment.kubernetes.io/revision": "1"}  # not the operator's
    assert result["metadata"]["generation"] == 2


async def test_a_write_that_changes_nothing_writes_nothing(k8s, kube):
    obj = _deployment()
    obj["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": 0.5, "nvidia.com/gpu": 8}}
    created = await kube.apply(obj)
    # Quantities are stored as the server's canonical strings, as a real server does.
    assert created["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "500m", "nvidia.com/gpu": "8"}}
    k8s.writes.clear()
    again = await kube.apply(obj)
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert k8s.writes == []


async def test_the_status_subresource_splits_spec_and_status_writes(kube):
    created = await kube.apply(_deployment())
    path = path_for(created)
    await kube.patch(path, {"status": {"readyReplicas": 7}})
    assert "status" not in await kube.get(path)  # the main resource does not take status
    await kube.patch(f"{path}/status", {"status": {"readyReplicas": 1}, "spec": {"replicas": 9}})
    stored = await kube.get(path)
    assert stored["status"] == {"readyReplicas": 1} and stored["spec"]["replicas"] == 1
    assert stored["metadata"]["generation"] == 1  # a status write is no spec change


async def test_a_stale_resource_version_is_a_conflict(kube):
    created = await kube.apply(_deployment())
    await kube.patch(path_for(created), {"spec": {"replicas": 2}})
    with pytest.raises(KubeError) as err:
        await kube.patch(path_for(created), {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
                                             "spec": {"replicas": 3}})
    assert err.value.status == 409 and not err.value.refused


async def test_scale_needs_the_spec_replicas_field(k8s, kube):
    body = {"apiVersion": API_VERSION, "kind": "RLJob", "metadata": {"name": "j", "namespace": NS},
            "spec": {"model": {"source": "builtin-tiny"}}}
    await kube.create(body)
    scale = path_of(API_VERSION, "RLJob", NS, "j") + "/scale"
    with pytest.raises(KubeError) as err:
        await kube.get(scale)
    assert err.value.status == 500 and ".spec.generators.replicas\" does not exist" in err.value.message
    await kube.patch(path_of(API_VERSION, "RLJob", NS, "j"), {"spec": {"generators": {"replicas": 3}}})
    assert (await kube.get(scale))["spec"]["replicas"] == 3
    await kube.patch(scale, {"spec": {"replicas": 5}})
    assert (await kube.get(path_of(API_VERSION, "RLJob", NS, "j")))["spec"]["generators"]["replicas"] == 5


async def test_deleting_an_owner_collects_its_dependents_and_lists_honour_label_selectors(kube):
    owner = await kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "o", "namespace": NS}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": owner["metadata"]["uid"]}
    for name, role in (("a", "x"), ("b", "y")):
        await kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": name, "namespace": NS, "labels": {"role": role},
                                        "ownerReferences": [ref]}})
    assert [o["metadata"]["name"] for o in await kube.list("v1", "ConfigMap", NS, "role=x")] == ["a"]
    assert [o["metadata"]["name"] for o in await kube.list("v1", "ConfigMap", NS, "role!=x,role")] == ["b"]
    await kube.delete(path_of("v1", "ConfigMap", NS, "o"))
    assert await kube.list("v1", "ConfigMap", NS, "role") == []


async def test_access_reviews_answer_as_the_test_set_them(k8s, kube):
    k8s.denied.add(("delete", "deployments", "rl"))

    async def allowed(verb: str, namespace: str) -> bool:
        review = await kube.create({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                    "metadata": {}, "spec": {"resourceAttributes": {
                                        "verb": verb, "group": "apps", "resource": "deployments",
                                        "namespace": namespace}}})
        return review["status"]["allowed"]

    assert await allowed("create", "rl") and await allowed("delete", "other")
    assert not await allowed("delete", "rl")
