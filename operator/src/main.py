"""`streamrl operator`: the kopf operator process (one replica; see the Helm chart). Loads
the settings once, builds the handler registry with them, runs kopf."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path

import kopf
import prometheus_client
import yaml

from streamrl.operator.handlers import register
from streamrl.operator.kube import KubeClient, KubeError
from streamrl.operator.leader import Elector
from streamrl.operator.reconcile import schema_version
from streamrl.operator.runtime import Runtime
from streamrl.operator.settings import CLUSTER_ID, Settings, load_settings
from streamrl.wire.addresses import join_host_port

log = logging.getLogger("streamrl.operator")


def local_client() -> KubeClient:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return KubeClient.in_cluster()
    path = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
    if not path.exists():
        raise ValueError("streamrl operator runs in a cluster (service account) or with KUBECONFIG pointing at a "
                         f"self-contained kubeconfig; {path} does not exist")
    return KubeClient.from_kubeconfig(yaml.safe_load(path.read_text()), "local")


def login(**kwargs) -> kopf.ConnectionInfo | None:
    """kopf's own credentials, as for local_client: the service account in a cluster, else the kubeconfig."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def kopf_settings() -> kopf.OperatorSettings:
    """kopf's settings for StreamRL: its finalizer and progress records under streamrl.io (not
    kopf.zalando.org), no scanning of CRDs and namespaces (the chart grants no cluster-wide
    list on them), Events posted (restarts, preemptions, terminal phases), a round in flight
    given time to finish on exit."""
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = "streamrl.io/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="streamrl.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="streamrl.io",
                                                                          key="last-handled-configuration")
    settings.scanning.disabled = True
    # On exit, a reconcile in flight finishes its round (it is idempotent, and bounded) rather
    # than being left orphaned half-way.
    settings.background.instant_exit_timeout = 5.0
    return settings


def operator_registry(settings: Settings) -> kopf.OperatorRegistry:
    """Every handler, and the login, on a registry of their own."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login)
    return register(registry, settings)


async def cluster_id(kube: KubeClient, settings: Settings) -> str:
    """The settings' cluster id, else the uid of the kube-system namespace (unique per cluster,
    stable for its life). ValueError saying how to set one when neither is to be had."""
    if settings.cluster_id:
        return settings.cluster_id
    try:
        namespace = await kube.get("/api/v1/namespaces/kube-system")
    except KubeError as err:
        namespace = None
        why = f"reading namespace kube-system was refused ({err})"
    else:
        why = "there is no namespace kube-system"
    if namespace is None:
        raise ValueError(f"the operator needs this cluster's id and {why}: set one with the chart's clusterId "
                         f"(env {CLUSTER_ID}), different in each cluster that runs an operator")
    return namespace["metadata"]["uid"]


async def serve(settings: Settings) -> None:
    runtime = Runtime(local_client(), settings)
    elector, tasks = None, []
    try:
        server = (await runtime.kube.version()).get("gitVersion", "")
        runtime.kubernetes_version = schema_version(server)  # ValueError: too old, said before anything runs
        runtime.cluster_id = await cluster_id(runtime.kube, settings)
        if settings.leader_election:
            identity = os.environ.get("POD_NAME") or socket.gethostname()
            elector = Elector(runtime.kube, settings.namespace, identity)
            await elector.acquire()
        if settings.metrics_port:
            prometheus_client.start_http_server(settings.metrics_port, settings.listen_host,
                                                registry=runtime.metrics.registry)
        namespaces = list(settings.watch_namespaces)
        log.info("operator up on Kubernetes %s (children checked against its %s schemas) as cluster %s: image %s, "
                 "CUDA image %s, watching %s, autoscaler reads %s, metrics on :%s, status every %gs", server,
                 runtime.kubernetes_version, runtime.cluster_id, settings.image, settings.cuda_image,
                 ", ".join(namespaces) or "every namespace",
                 settings.prometheus_url or "only allowed URLs RLJobs name", settings.metrics_port or "(off)",
                 settings.status_interval_s)
        stop = asyncio.Event()
        operator = asyncio.create_task(kopf.operator(
            registry=operator_registry(settings), settings=kopf_settings(), standalone=True,
            clusterwide=not namespaces, namespaces=namespaces, memo=kopf.Memo(runtime=runtime), stop_flag=stop,
            liveness_endpoint=f"http://{join_host_port(settings.listen_host, settings.health_port)}/healthz"))
        tasks.append(operator)
        if elector is None:
            await operator
            return
        keep = asyncio.create_task(elector.keep())
        tasks.append(keep)
        done, _ = await asyncio.wait({operator, keep}, return_when=asyncio.FIRST_COMPLETED)
        if keep in done:  # lost the lease: stop reconciling before another replica starts to
            stop.set()
            await operator
            keep.result()  # raises LostLeadership: the process exits non-zero and is restarted
        keep.cancel()
        operator.result()
    finally:
        for task in tasks:  # cancelled from outside: neither the operator nor the renewal outlives serve()
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if elector is not None:
            await elector.release()
        await runtime.kube.close()


def run(namespaces: list[str], health_port: int | None = None, metrics_port: int | None = None,
        prometheus_url: str | None = None) -> int:
    """Flags (None = not given; then the environment, then the defaults) -> a running operator.
    ValueError naming the flag or variable when a setting is unusable."""
    settings = load_settings(os.environ, namespaces=namespaces, health_port=health_port, metrics_port=metrics_port,
                             prometheus_url=prometheus_url)
    asyncio.run(serve(settings))
    return 0
