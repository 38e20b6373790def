"""The real kopf operator against an emulated API server: create -> children and status;
spec change -> children updated; suspend; invalid spec -> Invalid; trainer progress ->
status; a pool in another cluster -> created there, removed through the finalizer. Run under
the chart's RBAC in both modes: cluster-wide, and with operator.watchNamespaces (these tests
make every kind of request the operator makes: kopf's watches and patches of RLJobs, every
child kind, RLClusters and the Secrets of the operator's own namespace)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from streamrl.admin import AdminServer
from streamrl.metrics import ServiceMetrics
from streamrl.records import TrainerPhase
from streamrl.spec import API_VERSION
from tests.integration.operator.conftest import wait_for
from tests.unit.operator.trainer_bodies import last_iteration, trainer_status

ROOT = Path(__file__).resolve().parents[3]
NS = "rl"
pytestmark = pytest.mark.parametrize("watch_namespaces", [(), (NS,)], ids=["cluster-wide", "watch-rl"])
JOBS = f"/apis/{API_VERSION}/namespaces/{NS}/rljobs"
DEPLOYMENTS, JOBS_RES, CONFIGMAPS, SERVICES = "apps/v1/deployments", "batch/v1/jobs", "v1/configmaps", "v1/services"
RLJOB, RLCLUSTER = f"{API_VERSION}/rljobs", f"{API_VERSION}/rlclusters"


def example(name: str, file: str = "rljob-tiny-cpu.yaml") -> dict:
    body = yaml.safe_load((ROOT / "deploy" / "examples" / file).read_text())
    body["metadata"] = {"name": name, "namespace": NS}
    return body


async def create(k8s, body: dict) -> None:
    resp = await k8s.post(JOBS, json=body)
    assert resp.status in (200, 201), await resp.text()


def get(k8s, resource: str, name: str) -> dict:
    return k8s.objects[resource, NS, name]


def plain(value):
    """An emulator object as plain JSON data."""
    if hasattr(value, "items"):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


async def test_create_builds_children_and_reports_status(k8s, operator):
    await create(k8s, example("tiny"))
    await wait_for(lambda: get(k8s, RLJOB, "tiny")["status"]["phase"] == "Pending", what="status written")
    job = get(k8s, RLJOB, "tiny")
    for resource, name in [(CONFIGMAPS, "tiny-spec"), (JOBS_RES, "tiny-trainer"), (SERVICES, "tiny-trainer"),
                           (DEPLOYMENTS, "tiny-gen-default")]:
        child = get(k8s, resource, name)
        [owner] = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("RLJob", "tiny", job["metadata"]["uid"])
        assert child["metadata"]["labels"]["streamrl.io/job"] == "tiny"
    deployment = get(k8s, DEPLOYMENTS, "tiny-gen-default")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "streamrl:test"
    status = job["status"]
    assert status["observedGeneration"] == 1
    assert status["generators"]["labelSelector"] == "streamrl.io/job=tiny,streamrl.io/role=generator"
    assert status["generators"]["replicas"] == 1
    assert [c["type"] for c in status["conditions"]] == \
        ["Ready", "Progressing", "Suspended", "Complete", "Failed", "PodsReady", "ScalingLimited", "ClustersReady",
         "Queued"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"


async def test_spec_change_updates_children_and_suspend_scales_to_zero(k8s, operator):
    await create(k8s, example("grow"))
    await wait_for(lambda: get(k8s, DEPLOYMENTS, "grow-gen-default")["spec"]["replicas"] == 1)
    spec = plain(get(k8s, RLJOB, "grow")["spec"])
    spec["generators"]["pools"][0]["replicas"] = 3
    spec["generators"]["pools"].append({"name": "extra", "replicas": 1})
    resp = await k8s.patch(f"{JOBS}/grow", json={"spec": spec})
    assert resp.status == 200
    await wait_for(lambda: get(k8s, DEPLOYMENTS, "grow-gen-default")["spec"]["replicas"] == 3, what="scaled up")
    await wait_for(lambda: get(k8s, DEPLOYMENTS, "grow-gen-extra")["spec"]["replicas"] == 1, what="pool added")
    await wait_for(lambda: get(k8s, RLJOB, "grow")["status"]["generators"]["replicas"] == 4, what="status")
    # Remove the extra pool: its Deployment is pruned.
    spec["generators"]["pools"].pop()
    spec["suspend"] = True
    await k8s.patch(f"{JOBS}/grow", json={"spec": spec})
    await wait_for(lambda: get(k8s, DEPLOYMENTS, "grow-gen-extra").deleted, what="pool pruned")
    await wait_for(lambda: get(k8s, DEPLOYMENTS, "grow-gen-default")["spec"]["replicas"] == 0, what="suspended")
    assert get(k8s, JOBS_RES, "grow-trainer")["spec"]["suspend"] is True
    await wait_for(lambda: get(k8s, RLJOB, "grow")["status"]["phase"] == "Suspended", what="phase Suspended")


async def test_invalid_spec_becomes_invalid_with_the_field_named(k8s, operator):
    body = example("bad")
    body["spec"]["algorithm"]["groupSize"] = 1
    await create(k8s, body)
    await wait_for(lambda: get(k8s, RLJOB, "bad")["status"]["phase"] == "Invalid", what="phase Invalid")
    status = get(k8s, RLJOB, "bad")["status"]
    assert "spec.algorithm.groupSize" in status["message"]
    assert {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}["Failed"] == ("True", "InvalidSpec")
    assert not [k for k in k8s.objects if k[0] == CONFIGMAPS and k[2] == "bad-spec"]
    # A pod template Kubernetes would refuse is caught before anything is applied.
    body = example("badtemplate")
    body["spec"]["generators"]["pools"][0]["placement"] = {"template": {"spec": {"containers": [
        {"name": "main", "imagePullPolicy": "Sometimes-ish", "bogus": 1}]}}}
    await create(k8s, body)
    await wait_for(lambda: get(k8s, RLJOB, "badtemplate")["status"]["phase"] == "Invalid", what="template Invalid")
    assert "would be invalid" in get(k8s, RLJOB, "badtemplate")["status"]["message"]


async def test_status_reflects_the_trainers_progress(k8s, operator):
    status = trainer_status(TrainerPhase.RUNNING, iteration=7, num_iterations=15, samples_per_s=512.0,
                            last=last_iteration(7, reward_mean=0.625, pipeline_bubble_ratio=0.04))
    admin = AdminServer(ServiceMetrics("trainer").registry, lambda: status, lambda: True).start()
    try:
        operator.trainer_status = _fetch_from(admin)
        await create(k8s, example("live"))
        await wait_for(lambda: get(k8s, RLJOB, "live")["status"]["phase"] == "Running", what="phase Running")
        trainer = get(k8s, RLJOB, "live")["status"]["trainer"]
        assert trainer == {"ready": True, "readyPods": 0, "expectedPods": 1, "restarts": 0, "preemptions": 0,
                           "iteration": 7, "policyVersion": 7, "reward": 0.625, "pipelineBubbleRatio": 0.04,
                           "samplesPerSecond": 512.0, "incarnation": 0}  # resumedFrom, lastCheckpoint null: unset
    finally:
        admin.stop()


def _fetch_from(admin: AdminServer):
    async def fetch(job, namespace):  # the real HTTP path, to a real admin server
        async with httpx.AsyncClient() as http:
            return (await http.get(f"http://127.0.0.1:{admin.port}/status")).json()

    return fetch


async def test_a_trainer_status_with_a_renamed_field_is_reported_unreadable(k8s, operator):
    """A trainer of another version renamed policy_version: the job says so and reads nothing."""
    body = trainer_status(TrainerPhase.RUNNING, iteration=7).model_dump(mode="json", exclude_none=True)
    body["version"] = body.pop("policy_version")
    admin = AdminServer(ServiceMetrics("trainer").registry, lambda: body, lambda: True).start()
    try:
        operator.trainer_status = _fetch_from(admin)
        await create(k8s, example("skew"))
        await wait_for(lambda: "unreadable" in get(k8s, RLJOB, "skew")["status"]["message"], what="unreadable")
        status = get(k8s, RLJOB, "skew")["status"]
        assert (status["phase"], status["message"]) == \
            ("Pending", "the trainer's /status is unreadable: policy_version: Field required")
        ready = {c["type"]: c for c in status["conditions"]}["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "TrainerStatusUnreadable")
        assert status["trainer"] == {"ready": False, "readyPods": 0, "expectedPods": 1, "restarts": 0,
                                     "preemptions": 0}  # none half-read
    finally:
        admin.stop()


async def test_pool_in_another_cluster_is_created_there_and_removed_by_the_finalizer(k8s, remote_cluster, operator):
    remote, client = remote_cluster
    operator.clusters["dc-west"] = client
    operator.allowed_namespaces["dc-west"] = (NS,)
    await create(k8s, example("cross", "rljob-cross-dc.yaml"))
    await wait_for(lambda: get(k8s, SERVICES, "cross-trainer"), what="trainer Service")
    # Without an external address yet, the pool waits and says why.
    await wait_for(lambda: {c["type"]: c for c in get(k8s, RLJOB, "cross")["status"]["conditions"]}[
        "ClustersReady"]["status"] == "False", what="ClustersReady False")
    # The cloud's load balancer assigns an address.
    resp = await k8s.patch(f"/api/v1/namespaces/{NS}/services/cross-trainer/status",
                           json={"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}})
    assert resp.status == 200, await resp.text()
    await wait_for(lambda: remote.objects[DEPLOYMENTS, NS, "cross-gen-west"], timeout=15, what="remote pool")
    deployment = remote.objects[DEPLOYMENTS, NS, "cross-gen-west"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--trainer") + 1] == "203.0.113.7:50051"
    assert deployment["metadata"]["labels"]["streamrl.io/origin-namespace"] == NS
    assert "ownerReferences" not in deployment["metadata"]
    assert remote.objects[CONFIGMAPS, NS, "cross-spec"]
    assert not [k for k in k8s.objects if k[0] == DEPLOYMENTS and k[2] == "cross-gen-west"]  # not built locally
    await wait_for(lambda: {c["type"]: c["status"] for c in get(k8s, RLJOB, "cross")["status"]["conditions"]}[
        "ClustersReady"] == "True", what="ClustersReady True")
    job = get(k8s, RLJOB, "cross")
    assert "streamrl.io/finalizer" in job["metadata"]["finalizers"]  # the operator's own, not kopf.zalando.org

    await k8s.delete(f"{JOBS}/cross")
    await wait_for(lambda: remote.objects[DEPLOYMENTS, NS, "cross-gen-west"].deleted, what="remote pool removed")
    await wait_for(lambda: remote.objects[CONFIGMAPS, NS, "cross-spec"].deleted, what="remote spec removed")
    await wait_for(lambda: get(k8s, RLJOB, "cross").deleted, what="RLJob gone once the finalizer ran")


async def test_rlcluster_with_an_unsafe_or_missing_kubeconfig_is_inactive_with_the_reason(k8s, operator):
    import base64

    unsafe = {"apiVersion": "v1", "kind": "Config", "current-context": "west",
              "contexts": [{"name": "west", "context": {"cluster": "west", "user": "rl"}}],
              "clusters": [{"name": "west", "cluster": {"server": "https://203.0.113.9:6443"}}],
              "users": [{"name": "rl", "user": {"exec": {"command": "aws", "args": ["eks", "get-token"]}}}]}
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "west-kubeconfig", "namespace": operator.settings.namespace},
              "data": {"kubeconfig": base64.b64encode(yaml.safe_dump(unsafe).encode()).decode()}}
    resp = await k8s.post(f"/api/v1/namespaces/{operator.settings.namespace}/secrets", json=secret)
    assert resp.status in (200, 201), await resp.text()
    specs = {"west": {"kubeconfigSecretRef": {"name": "west-kubeconfig"}, "allowedNamespaces": [NS]},
             "east": {"kubeconfigSecretRef": {"name": "east-kubeconfig"}, "allowedNamespaces": ["*"]},
             "north": {"kubeconfigSecret": {"name": "north-kubeconfig"},  # a typo the API server would prune
                       "allowedNamespaces": [NS]}}
    for name, spec in specs.items():
        resp = await k8s.post(f"/apis/{RLCLUSTER}", json={
            "apiVersion": API_VERSION, "kind": "RLCluster", "metadata": {"name": name}, "spec": spec})
        assert resp.status in (200, 201), await resp.text()
    clusters = RLCLUSTER
    await wait_for(lambda: k8s.objects[clusters, None, "west"]["status"]["phase"] == "Inactive", what="west checked")
    await wait_for(lambda: k8s.objects[clusters, None, "east"]["status"]["phase"] == "Inactive", what="east checked")
    await wait_for(lambda: k8s.objects[clusters, None, "north"]["status"]["phase"] == "Inactive", what="north checked")
    north = k8s.objects[clusters, None, "north"]["status"]
    assert north["message"] == "spec.kubeconfigSecretRef: Field required; spec.kubeconfigSecret: unknown field"
    assert north["conditions"][0]["reason"] == "InvalidSpec"
    west, east = k8s.objects[clusters, None, "west"]["status"], k8s.objects[clusters, None, "east"]["status"]
    assert "user.exec is not allowed" in west["message"] and west["conditions"][0]["reason"] == "InvalidKubeconfig"
    assert "east-kubeconfig not found" in east["message"] and east["conditions"][0]["reason"] == "SecretMissing"
    assert operator.clusters == {}


async def test_nodeport_trainer_is_dialled_at_the_external_host_and_node_port(k8s, remote_cluster, operator):
    remote, client = remote_cluster
    operator.clusters["dc-west"] = client
    operator.allowed_namespaces["dc-west"] = (NS,)
    body = example("np", "rljob-cross-dc.yaml")
    body["spec"]["trainer"] = {"serviceType": "NodePort", "externalHost": "gw.dc-east.example", "minGenerators": 2}
    await create(k8s, body)
    await wait_for(lambda: get(k8s, SERVICES, "np-trainer"), what="trainer Service")
    # The API server allocates the node port.
    ports = plain(get(k8s, SERVICES, "np-trainer")["spec"]["ports"])
    ports[0]["nodePort"] = 31051
    await k8s.patch(f"/api/v1/namespaces/{NS}/services/np-trainer", json={"spec": {"ports": ports}})
    await wait_for(lambda: remote.objects[DEPLOYMENTS, NS, "np-gen-west"], timeout=15, what="remote pool")
    args = remote.objects[DEPLOYMENTS, NS, "np-gen-west"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--trainer") + 1] == "gw.dc-east.example:31051"
