"""The operator scenarios against a real cluster: run with a KUBECONFIG that points at one
(a kind or k3d cluster will do) where the CRDs are installed:

    kubectl apply -f helm/streamrl/files/crds/
    KUBECONFIG=~/.kube/config python -m pytest -m cluster tests/cluster

Skipped without KUBECONFIG. The operator runs in-process (real kopf, real API server); the
pods it creates need the image to be pullable for the phase to go beyond Pending, which is
not asserted here (test_chart_on_cluster.py runs the operator from its image, installed by
the chart).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import kopf
import pytest
import yaml

from streamrl.operator.kube import KubeClient, path_of
from streamrl.operator.main import operator_registry
from streamrl.operator.runtime import Runtime
from streamrl.operator.settings import Settings
from streamrl.spec import API_VERSION

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG does not point at a cluster")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def cluster():
    kube = KubeClient.from_kubeconfig(yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text()), "local")
    namespace = f"streamrl-test-{uuid.uuid4().hex[:6]}"
    await kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    yield kube, namespace
    await kube.delete(f"/api/v1/namespaces/{namespace}")
    await kube.close()


@pytest.fixture
async def operator(cluster):
    kube, namespace = cluster
    settings = Settings(namespace=namespace, watch_namespaces=(namespace,))
    runtime = Runtime(kube, settings)
    stop = asyncio.Event()
    task = asyncio.create_task(kopf.operator(registry=operator_registry(settings), standalone=True,
                                             namespaces=[namespace], clusterwide=False,
                                             stop_flag=stop, memo=kopf.Memo(runtime=runtime)))
    yield runtime
    # kopf puts a finalizer on every RLJob (its timer and daemon): delete them while it runs, or
    # the namespace would stay Terminating.
    for job in await kube.list(API_VERSION, "RLJob", namespace):
        await kube.delete(path_of(API_VERSION, "RLJob", namespace, job["metadata"]["name"]))
    await _until(lambda: _none_left(kube, namespace), timeout=60)
    stop.set()
    await asyncio.wait_for(task, 30)


async def _none_left(kube, namespace) -> bool:
    return not await kube.list(API_VERSION, "RLJob", namespace)


async def _until(check, timeout=60):
    for _ in range(int(timeout / 0.5)):
        if result := await check():
            return result
        await asyncio.sleep(0.5)
    raise AssertionError("timed out")


async def test_create_children_status_and_invalid(cluster, operator):
    kube, namespace = cluster
    body = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    body["metadata"] = {"name": "tiny", "namespace": namespace}
    await kube.create(body)
    deployment = await _until(lambda: kube.get(path_of("apps/v1", "Deployment", namespace, "tiny-gen-default")))
    assert deployment["metadata"]["ownerReferences"][0]["name"] == "tiny"
    job = await _until(lambda: _with_status(kube, namespace, "tiny"))
    assert job["status"]["generators"]["labelSelector"] == "streamrl.io/job=tiny,streamrl.io/role=generator"
    bad = {**body, "metadata": {"name": "bad", "namespace": namespace}}
    bad["spec"] = {**body["spec"], "generators": {"pools": [{"name": "p", "placement": {
        "template": {"spec": {"containers": [{"name": "main", "bogus": 1}]}}}}]}}
    await kube.create(bad)
    job = await _until(lambda: _with_status(kube, namespace, "bad"))
    assert job["status"]["phase"] == "Invalid"


async def _with_status(kube, namespace, name):
    job = await kube.get(path_of(API_VERSION, "RLJob", namespace, name))
    return job if job and job.get("status", {}).get("phase") else None
