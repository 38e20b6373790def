"""`streamrl operator`: the kopf operator process (one replica; see the Helm chart)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import kopf
import prometheus_client
import yaml

from streamrl.operator.builders import Settings
from streamrl.operator.kube import KubeClient

log = logging.getLogger("streamrl.operator")


def settings_from_env() -> Settings:
    """What the chart passes in the environment."""
    defaults = Settings()
    return Settings(image=os.environ.get("STREAMRL_JOB_IMAGE") or defaults.image,
                    image_pull_policy=os.environ.get("STREAMRL_JOB_IMAGE_PULL_POLICY") or defaults.image_pull_policy,
                    trainer_backoff_limit=int(os.environ.get("STREAMRL_TRAINER_BACKOFF_LIMIT")
                                              or defaults.trainer_backoff_limit))


def local_client() -> KubeClient:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return KubeClient.in_cluster()
    path = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
    if not path.exists():
        raise ValueError("streamrl operator runs in a cluster (service account) or with KUBECONFIG pointing at a "
                         f"self-contained kubeconfig; {path} does not exist")
    return KubeClient.from_kubeconfig(yaml.safe_load(path.read_text()), "local")


def run(namespaces: list[str], health_port: int = 8080, metrics_port: int = 8081, prometheus_url: str = "") -> int:
    if prometheus_url and not prometheus_url.startswith(("http://", "https://")):
        raise ValueError(f"--prometheus-url (STREAMRL_PROMETHEUS_URL) must be an http:// or https:// URL, "
                         f"got {prometheus_url!r}")
    from streamrl.operator.handlers import Runtime  # importing the module registers the kopf handlers

    async def main() -> None:
        runtime = Runtime(local_client(), settings_from_env(),
                          namespace=os.environ.get("STREAMRL_OPERATOR_NAMESPACE", "default"),
                          prometheus_url=prometheus_url)
        if metrics_port:
            prometheus_client.start_http_server(metrics_port, registry=runtime.metrics.registry)
        log.info("operator up: image %s, watching %s, autoscaler reads %s, metrics on :%s", runtime.settings.image,
                 ", ".join(namespaces) or "every namespace", prometheus_url or "only what RLJobs name",
                 metrics_port or "(off)")
        try:
            await kopf.operator(standalone=True, clusterwide=not namespaces, namespaces=namespaces or None,
                                memo=kopf.Memo(runtime=runtime),
                                liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz")
        finally:
            await runtime.kube.close()

    asyncio.run(main())
    return 0
