"""`streamrl operator`'s own start: serve() with settings loaded from the environment, its
registry and kopf's login from KUBECONFIG, against kmock, watching every namespace; a job
gets its children (with the configured image) and a status."""

from __future__ import annotations

import asyncio

import httpx
import yaml

import streamrl.operator.main as operator_main
from streamrl.operator.kube import KubeClient
from streamrl.operator.settings import load_settings
from tests.integration.operator.conftest import wait_for
from tests.integration.operator.test_operator import DEPLOYMENTS, RLJOB, create, example, get


async def test_serve_reconciles_with_the_settings_it_was_started_with(k8s, monkeypatch, tmp_path, unused_tcp_port):
    url = str(k8s.url).rstrip("/")
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "k",
                  "contexts": [{"name": "k", "context": {"cluster": "k", "user": "u"}}],
                  "clusters": [{"name": "k", "cluster": {"server": url}}],
                  "users": [{"name": "u", "user": {"token": "t"}}]}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))  # kopf's login reads it
    monkeypatch.setattr(operator_main, "local_client", lambda: KubeClient(url))  # kmock speaks http, not https
    settings = load_settings({"STREAMRL_JOB_IMAGE": "streamrl:served", "STREAMRL_OPERATOR_STATUS_INTERVAL_S": "0.5"},
                             metrics_port=0, health_port=unused_tcp_port)
    k8s.namespaces["kube-system"] = {"apiVersion": "v1", "kind": "Namespace",
                                     "metadata": {"name": "kube-system", "uid": "0e6c1b9d-kube-system"}}
    task = asyncio.create_task(operator_main.serve(settings))
    try:
        await create(k8s, example("served"))
        await wait_for(lambda: get(k8s, RLJOB, "served")["status"]["phase"] == "Pending", timeout=20,
                       what="status written by the served operator")
        container = get(k8s, DEPLOYMENTS, "served-gen-default")["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == "streamrl:served"
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"http://127.0.0.1:{unused_tcp_port}/healthz")).status_code == 200
        assert not task.done(), task
        # It leads (the Lease in its namespace), and is this cluster by kube-system's uid.
        lease = get_lease(k8s, settings.namespace)
        assert lease["spec"]["holderIdentity"] and lease["spec"]["leaseDurationSeconds"] == 15
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def get_lease(k8s, namespace: str) -> dict:
    return k8s.objects["coordination.k8s.io/v1/leases", namespace, "streamrl-operator"]


class _FakeOldServer:
    """An API server older than the trainer's Job needs."""

    async def version(self) -> dict:
        return {"gitVersion": "v1.30.5-eks-1"}

    async def close(self) -> None:
        pass


def test_an_api_server_older_than_1_31_stops_the_start_with_the_reason(monkeypatch, capsys):
    from streamrl.cli import main

    monkeypatch.setattr(operator_main, "local_client", lambda: _FakeOldServer())
    assert main(["operator", "--metrics-port", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "streamrl operator: the API server is Kubernetes v1.30.5-eks-1: StreamRL needs 1.31 or newer (the trainer's "
        "Job successPolicy)")
