"""The emulator behaves as a real API server where kmock alone did not, and where the
difference hid operator bugs (emulator.py lists the rules): each rule is checked here through
the operator's own client, so a test of the operator that passes on the emulator means what it
would mean on a cluster."""

from __future__ import annotations

import httpx
import pytest

from streamrl.operator.kube import KubeClient, KubeError, path_for, path_of
from streamrl.spec import API_VERSION
from tests.integration.operator import rbac
from tests.integration.operator.conftest import OPERATOR_TOKEN, chart_rbac

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


# ---- RBAC (rbac.py, with the chart's rules as the operator fixture installs them) ------------------------
@pytest.fixture
async def rbac_client(k8s):
    """A client as the chart's ServiceAccount, its requests authorized by the cluster-wide chart's RBAC."""
    k8s.users[OPERATOR_TOKEN], k8s.authorizer = chart_rbac(())
    client = KubeClient(str(k8s.url), token=OPERATOR_TOKEN)
    yield client
    await client.close()


async def test_rbac_refuses_with_the_api_servers_message_before_looking_for_the_object(k8s, rbac_client):
    with pytest.raises(KubeError) as err:  # no such Secret: RBAC is checked before existence
        await rbac_client.list("v1", "Secret", "kube-system")
    assert (err.value.status, err.value.reason) == (403, "Forbidden")
    assert err.value.message.endswith(
        'secrets is forbidden: User "system:serviceaccount:streamrl-system:rel-streamrl" cannot list resource '
        '"secrets" in API group "" in the namespace "kube-system"')
    with pytest.raises(KubeError) as err:
        await rbac_client.delete("/apis/apps/v1/daemonsets/x")
    assert err.value.message.endswith('daemonsets.apps "x" is forbidden: User "system:serviceaccount:streamrl-system:'
                                      'rel-streamrl" cannot delete resource "daemonsets" in API group "apps" at '
                                      'the cluster scope')
    k8s.refused.clear()
    assert (await rbac_client.version())["minor"] == "33"  # system:discovery, granted to every authenticated user
    assert await rbac_client.get(path_of("v1", "ConfigMap", NS, "missing")) is None  # allowed: 404


async def test_rbac_tells_subresources_apart_and_leaves_the_tests_own_requests_alone(k8s, kube, rbac_client):
    await kube.create(_deployment())  # the test's own client: no token, not checked
    with pytest.raises(KubeError) as err:  # pods: get, list; pods/log: get; pods/exec: nothing
        await rbac_client.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS}})
    assert 'cannot create resource "pods"' in err.value.message
    assert await rbac_client.log_tail(NS, "p", "main") == ""  # pods/log get: allowed (404: no log)
    with pytest.raises(KubeError, match='cannot patch resource "deployments/scale"'):
        await rbac_client.patch(path_for(_deployment()) + "/scale", {"spec": {"replicas": 2}})
    k8s.refused.clear()


async def test_an_apply_that_creates_needs_create_as_well_as_patch(k8s, kube, rbac_client):
    patch_only = [{"kind": "Role", "metadata": {"name": "r", "namespace": NS},
                   "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"]}]},
                  {"kind": "RoleBinding", "metadata": {"name": "r", "namespace": NS},
                   "roleRef": {"kind": "Role", "name": "r"},
                   "subjects": [{"kind": "ServiceAccount", "name": "rel-streamrl"}]}]  # the binding's namespace
    k8s.users[OPERATOR_TOKEN] = rbac.service_account(NS, "rel-streamrl")
    k8s.authorizer = rbac.Authorizer(patch_only)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": NS}, "data": {"a": "1"}}
    with pytest.raises(KubeError, match='cannot create resource "configmaps" in API group "" in the namespace "rl"'):
        await rbac_client.apply(config)
    k8s.refused.clear()
    await kube.apply(config)  # the test creates it: the operator may now apply it
    assert (await rbac_client.apply({**config, "data": {"a": "2"}}))["data"] == {"a": "2"}


async def test_an_unknown_token_is_unauthorized(k8s, rbac_client):
    stranger = KubeClient(str(k8s.url), token="stolen")
    with pytest.raises(KubeError) as err:
        await stranger.get(path_of("v1", "ConfigMap", NS, "c"))
    assert err.value.status == 401
    await stranger.close()


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    ("GET", "/apis/streamrl.io/v1/rljobs", {}, ("list", "streamrl.io", "rljobs", "", "", "")),
    ("GET", "/apis/streamrl.io/v1/namespaces/rl/rljobs", {"watch": "true"},
     ("watch", "streamrl.io", "rljobs", "", "rl", "")),
    ("GET", "/api/v1/namespaces/rl/pods/p/log", {}, ("get", "", "pods", "log", "rl", "p")),
    ("POST", "/api/v1/namespaces/rl/events", {}, ("create", "", "events", "", "rl", "")),
    ("PUT", "/apis/streamrl.io/v1/namespaces/rl/rljobs/j/finalizers", {},
     ("update", "streamrl.io", "rljobs", "finalizers", "rl", "j")),
    ("PATCH", "/apis/streamrl.io/v1/namespaces/rl/rljobs/j/status", {},
     ("patch", "streamrl.io", "rljobs", "status", "rl", "j")),
    ("DELETE", "/api/v1/namespaces/rl/secrets/j-token", {}, ("delete", "", "secrets", "", "rl", "j-token")),
    ("DELETE", "/api/v1/namespaces/rl/secrets", {}, ("deletecollection", "", "secrets", "", "rl", "")),
    ("GET", "/api/v1/namespaces/rl", {}, ("get", "", "namespaces", "", "rl", "rl")),
    ("GET", "/api/v1/namespaces/rl/configmaps", {"fieldSelector": "metadata.name=c"},
     ("list", "", "configmaps", "", "rl", "c")),
    ("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/x", {},
     ("get", "rbac.authorization.k8s.io", "clusterroles", "", "", "x")),
])
def test_requests_map_to_the_attributes_the_api_server_authorizes(method, path, query, expected):
    a = rbac.request_attributes(method, path, query)
    assert a.resource_request and (a.verb, a.api_group, a.resource, a.subresource, a.namespace, a.name) == expected


@pytest.mark.parametrize("path", ["/version", "/apis", "/api/v1", "/apis/streamrl.io/v1", "/openapi/v3"])
def test_discovery_is_a_non_resource_request_every_authenticated_user_may_get(path):
    a = rbac.request_attributes("GET", path, {})
    assert not a.resource_request and a.verb == "get"
    assert rbac.Authorizer([]).allows(rbac.service_account("ns", "sa"), a)
    anonymous = rbac.User("system:anonymous", ("system:unauthenticated",))  # /version only (public info)
    assert rbac.Authorizer([]).allows(anonymous, a) == (path == "/version")


async def test_a_field_another_manager_co_owns_stays_when_the_applier_stops_applying_it(k8s, kube):
    # As structured-merge-diff prunes: only what no other manager owns. An earlier writer without
    # a fieldManager is recorded under its user agent's name.
    first = _deployment(nodeSelector={"pool": "a"})
    legacy = httpx.AsyncClient(base_url=str(k8s.url), headers={"User-Agent": "python-httpx/0.28.1"})
    try:
        resp = await legacy.post("/apis/apps/v1/namespaces/rl/deployments", json=first)
        assert resp.status_code in (200, 201), resp.text
    finally:
        await legacy.aclose()
    stored = await kube.get(path_for(first))
    assert [(e["manager"], e["operation"]) for e in stored["metadata"]["managedFields"]] == [
        ("python-httpx", "Update")]
    await kube.apply(first)  # the same values: shared with python-httpx
    result = await kube.apply(_deployment())
    assert result["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "a"}  # python-httpx still owns it
    assert {(e["manager"], e["operation"]) for e in result["metadata"]["managedFields"]} == {
        ("python-httpx", "Update"), ("streamrl-operator", "Apply")}
