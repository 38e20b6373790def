"""Pools in other clusters over their whole life, on the real operator against two emulated
API servers: a remote pool gets the job's spec, token and NetworkPolicy there; a pool the
spec moves home is pruned from the other cluster; an RLCluster lets in only the namespaces
it allows, is probed again on a timer (a dead cluster turns Inactive) and for the permissions
the operator needs there; deleting a job never hangs on a cluster that is gone."""

from __future__ import annotations

import asyncio
import base64

import pytest
import yaml

from streamrl.operator.kube import KubeClient
from streamrl.spec import API_VERSION
from tests.integration.operator.conftest import wait_for
from tests.integration.operator.test_operator import (
    CONFIGMAPS,
    DEPLOYMENTS,
    JOBS,
    NS,
    RLCLUSTER,
    RLJOB,
    create,
    example,
    get,
    plain,
)

SECRETS, POLICIES = "v1/secrets", "networking.k8s.io/v1/networkpolicies"
KUBECONFIG = {"apiVersion": "v1", "kind": "Config", "current-context": "west",
              "contexts": [{"name": "west", "context": {"cluster": "west", "user": "rl"}}],
              "clusters": [{"name": "west", "cluster": {"server": "https://west.example:6443"}}],
              "users": [{"name": "rl", "user": {"token": "s3cr3t"}}]}


def remote_exists(remote, resource: str, name: str) -> bool:
    try:
        return not remote.objects[resource, NS, name].deleted
    except KeyError:
        return False


async def exposed(k8s, job: str) -> None:
    """The cloud's load balancer gives the trainer's Service an address."""
    await wait_for(lambda: get(k8s, "v1/services", f"{job}-trainer"), what="trainer Service")
    resp = await k8s.patch(f"/api/v1/namespaces/{NS}/services/{job}-trainer/status",
                           json={"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}})
    assert resp.status == 200, await resp.text()


async def test_a_remote_pool_carries_the_jobs_token_and_fence_and_goes_when_the_spec_moves_it_home(
        k8s, remote_cluster, operator):
    remote, client = remote_cluster
    operator.clusters["dc-west"] = client
    operator.allowed_namespaces["dc-west"] = (NS,)
    await create(k8s, example("move", "rljob-cross-dc.yaml"))
    await exposed(k8s, "move")
    await wait_for(lambda: remote_exists(remote, DEPLOYMENTS, "move-gen-west"), timeout=15, what="remote pool")
    local_token = get(k8s, SECRETS, "move-token")["data"]["token"]
    assert remote.objects[SECRETS, NS, "move-token"]["data"]["token"] == local_token  # the same job, one token
    policy = remote.objects[POLICIES, NS, "move-job"]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"streamrl.io/job": "move"}}
    assert "ownerReferences" not in remote.objects[SECRETS, NS, "move-token"]["metadata"]
    # The spec moves the pool home: built here, removed there with everything the job had there.
    spec = plain(get(k8s, RLJOB, "move")["spec"])
    del spec["generators"]["pools"][1]["clusterRef"]
    assert (await k8s.patch(f"{JOBS}/move", json={"spec": spec})).status == 200
    await wait_for(lambda: get(k8s, DEPLOYMENTS, "move-gen-west"), what="pool built at home")
    for resource, name in [(DEPLOYMENTS, "move-gen-west"), (CONFIGMAPS, "move-spec"), (SECRETS, "move-token"),
                           (POLICIES, "move-job")]:
        await wait_for(lambda r=resource, n=name: not remote_exists(remote, r, n), what=f"{name} pruned remotely")


async def test_a_cluster_that_does_not_allow_the_jobs_namespace_gets_no_pool(k8s, remote_cluster, operator):
    remote, client = remote_cluster
    operator.clusters["dc-west"] = client
    operator.allowed_namespaces["dc-west"] = ("team-b",)
    await create(k8s, example("fenced", "rljob-cross-dc.yaml"))
    await exposed(k8s, "fenced")
    await wait_for(lambda: {c["type"]: c for c in get(k8s, RLJOB, "fenced")["status"]["conditions"]}[
        "ClustersReady"]["message"] == "RLCluster 'dc-west' (pool west) does not allow namespace rl (its "
                                       "spec.allowedNamespaces)", what="refusal said")
    assert not remote_exists(remote, DEPLOYMENTS, "fenced-gen-west")


async def test_deleting_a_job_whose_cluster_is_gone_or_unreachable_does_not_hang(k8s, remote_cluster, operator):
    remote, client = remote_cluster
    operator.clusters["dc-west"] = client
    operator.allowed_namespaces["dc-west"] = (NS,)
    for job in ("gone", "cut"):
        await create(k8s, example(job, "rljob-cross-dc.yaml"))
        await exposed(k8s, job)
        await wait_for(lambda j=job: remote_exists(remote, DEPLOYMENTS, f"{j}-gen-west"), timeout=15,
                       what=f"{job}'s remote pool")
    operator.clusters.pop("dc-west")  # the cluster is no longer registered (its RLCluster object never existed)
    await k8s.delete(f"{JOBS}/gone")
    await wait_for(lambda: get(k8s, RLJOB, "gone").deleted, what="deletion finished: nothing can reach it")
    # The RLCluster exists but cannot be reached: the finalizer waits, until the job says to leave the pool.
    resp = await k8s.post(f"/apis/{RLCLUSTER}", json={"apiVersion": API_VERSION, "kind": "RLCluster",
                                                      "metadata": {"name": "dc-west"},
                                                      "spec": {"kubeconfigSecretRef": {"name": "absent"},
                                                               "allowedNamespaces": [NS]}})
    assert resp.status in (200, 201)
    await k8s.delete(f"{JOBS}/cut")
    await wait_for(lambda: get(k8s, RLJOB, "cut")["metadata"].get("deletionTimestamp"), what="deleting")
    await wait_for(lambda: not get(k8s, RLJOB, "cut").deleted and "streamrl.io/finalizer" in get(
        k8s, RLJOB, "cut")["metadata"]["finalizers"], what="held by the finalizer")
    resp = await k8s.patch(f"{JOBS}/cut", json={"metadata": {"annotations": {"streamrl.io/orphan-remote": "true"}}})
    assert resp.status == 200
    await wait_for(lambda: get(k8s, RLJOB, "cut").deleted, timeout=15, what="deletion finished, pool left")
    assert remote_exists(remote, DEPLOYMENTS, "cut-gen-west")


@pytest.fixture
def registered(k8s, remote_cluster, operator, monkeypatch):
    """An RLCluster whose kubeconfig Secret points at the remote emulator (kmock speaks http:
    the client the operator builds from it is pointed there)."""
    remote, _ = remote_cluster
    clients = []

    def from_kubeconfig(config, name):
        client = KubeClient(str(remote.url), name=name)
        clients.append(client)
        return client

    monkeypatch.setattr(KubeClient, "from_kubeconfig", staticmethod(from_kubeconfig))
    return remote, clients


async def _register(k8s, operator, allowed: list[str]) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "west-kubeconfig", "namespace": operator.settings.namespace},
              "data": {"kubeconfig": base64.b64encode(yaml.safe_dump(KUBECONFIG).encode()).decode()}}
    assert (await k8s.post(f"/api/v1/namespaces/{operator.settings.namespace}/secrets", json=secret)).status in (
        200, 201)
    resp = await k8s.post(f"/apis/{RLCLUSTER}", json={
        "apiVersion": API_VERSION, "kind": "RLCluster", "metadata": {"name": "dc-west"},
        "spec": {"kubeconfigSecretRef": {"name": "west-kubeconfig"}, "allowedNamespaces": allowed}})
    assert resp.status in (200, 201)


def cluster_status(k8s) -> dict:
    return k8s.objects[RLCLUSTER, None, "dc-west"]["status"]


async def test_a_cluster_whose_user_may_not_do_what_the_operator_does_there_is_inactive(k8s, registered, operator):
    remote, _ = registered
    remote.denied.add(("delete", "deployments", NS))
    await _register(k8s, operator, [NS])
    await wait_for(lambda: cluster_status(k8s)["phase"] == "Inactive", what="Inactive")
    assert cluster_status(k8s)["message"] == "the kubeconfig's user may not: delete deployments in namespace rl"
    assert cluster_status(k8s)["conditions"][0]["reason"] == "Forbidden"
    assert "dc-west" not in operator.clusters
    remote.denied.clear()  # RBAC fixed there: the next probe finds it
    await wait_for(lambda: cluster_status(k8s)["phase"] == "Active", timeout=10, what="Active after the fix")
    assert operator.allowed_namespaces["dc-west"] == (NS,)


async def test_a_cluster_whose_kubeconfig_is_unchanged_keeps_its_client_and_is_not_reviewed_each_probe(
        k8s, registered, operator):
    """N16: each 60 s probe replaced and closed the live client under in-flight reconciles and
    posted 18 SelfSubjectAccessReviews per allowed namespace."""
    remote, clients = registered
    await _register(k8s, operator, [NS])
    await wait_for(lambda: cluster_status(k8s)["phase"] == "Active", what="Active")
    reviews = sum(1 for r in remote._requests if r.url.path.endswith("/selfsubjectaccessreviews"))
    versions = sum(1 for r in remote._requests if r.url.path == "/version")
    await asyncio.sleep(3.5)  # three more probes (one a second here)
    assert len(clients) == 1 and not clients[0]._http.is_closed and operator.clusters["dc-west"] is clients[0]
    assert sum(1 for r in remote._requests if r.url.path.endswith("/selfsubjectaccessreviews")) == reviews
    assert sum(1 for r in remote._requests if r.url.path == "/version") >= versions + 3  # still probed
    # A new kubeconfig: a new client; the old one stays open for its grace, then closes.
    operator.client_grace_s = 0.5
    secret = f"/api/v1/namespaces/{operator.settings.namespace}/secrets/west-kubeconfig"
    config = base64.b64encode(yaml.safe_dump({**KUBECONFIG, "preferences": {"colors": True}}).encode()).decode()
    assert (await k8s.patch(secret, json={"data": {"kubeconfig": config}})).status == 200
    await wait_for(lambda: len(clients) == 2, what="a new client for the new kubeconfig")
    assert not clients[0]._http.is_closed
    await wait_for(lambda: clients[0]._http.is_closed, what="the old client closed after its grace")


async def test_a_cluster_that_stops_answering_turns_inactive_on_the_next_probe(k8s, registered, operator):
    remote, clients = registered
    operator.client_grace_s = 0.1
    await _register(k8s, operator, ["*"])
    await wait_for(lambda: cluster_status(k8s)["phase"] == "Active", what="Active")
    remote.fail_once[("GET", "/version")] = 503
    await wait_for(lambda: cluster_status(k8s)["phase"] == "Inactive", timeout=10, what="Inactive after a probe")
    assert cluster_status(k8s)["conditions"][0]["reason"] == "Unreachable"
    assert "dc-west" not in operator.clusters
    await wait_for(lambda: cluster_status(k8s)["phase"] == "Active", timeout=10, what="back")
    assert all(c._http.is_closed for c in clients[:-1])  # every replaced client closed, none leaked


async def test_a_remote_object_another_home_cluster_made_is_not_overwritten(k8s, remote_cluster, operator):
    remote, client = remote_cluster
    operator.clusters["dc-west"] = client
    operator.allowed_namespaces["dc-west"] = (NS,)
    theirs = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "twin-spec", "namespace": NS, "labels": {"streamrl.io/origin-cluster": "other-home",
                                                         "streamrl.io/origin-namespace": NS,
                                                         "streamrl.io/origin-job": "twin"}}, "data": {"job.yaml": "x"}}
    await client.create(theirs)
    await create(k8s, example("twin", "rljob-cross-dc.yaml"))
    await exposed(k8s, "twin")
    await wait_for(lambda: "exists and is not this job's" in {c["type"]: c for c in get(k8s, RLJOB, "twin")[
        "status"]["conditions"]}["ClustersReady"]["message"], what="conflict said")
    assert remote.objects[CONFIGMAPS, NS, "twin-spec"]["data"] == {"job.yaml": "x"}
    assert not remote_exists(remote, DEPLOYMENTS, "twin-gen-west")


async def test_a_remote_secret_of_the_tokens_name_that_is_someone_elses_is_not_deleted(k8s, remote_cluster, operator):
    # The remote token Secret is deleted by name (Secrets are never listed): only when it carries the job's origin.
    remote, client = remote_cluster
    operator.clusters["dc-west"] = client
    operator.allowed_namespaces["dc-west"] = (NS,)
    await client.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "theirs-token", "namespace": NS},
                         "data": {"token": "dGhlaXJz"}})
    await create(k8s, example("theirs", "rljob-cross-dc.yaml"))
    await exposed(k8s, "theirs")
    await wait_for(lambda: "Secret theirs-token in cluster dc-west exists and is not this job's" in {
        c["type"]: c for c in get(k8s, RLJOB, "theirs")["status"]["conditions"]}["ClustersReady"]["message"],
        what="conflict said")
    assert remote_exists(remote, CONFIGMAPS, "theirs-spec")
    spec = plain(get(k8s, RLJOB, "theirs")["spec"])
    del spec["generators"]["pools"][1]["clusterRef"]  # home: no pool left there, so the job's objects there go
    assert (await k8s.patch(f"{JOBS}/theirs", json={"spec": spec})).status == 200
    await wait_for(lambda: not remote_exists(remote, CONFIGMAPS, "theirs-spec"), what="the job's own pruned remotely")
    assert remote.objects[SECRETS, NS, "theirs-token"]["data"] == {"token": "dGhlaXJz"}
