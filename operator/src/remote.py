"""Generator pools in other clusters (RLClusters): their spec, token, NetworkPolicy and
Deployment applied there, marked with origin labels since owner references cannot cross
clusters; what the spec no longer places in a cluster pruned by those labels; everything
removed when the job goes (or left, when its RLCluster is gone or the job says so).
Knows no phase: it returns what went wrong."""

from __future__ import annotations

import logging

import httpx

from streamrl.operator.builders import TRAINER_GRPC_PORT, build_configmap, build_generators
from streamrl.operator.kube import KubeClient, KubeError, path_of
from streamrl.operator.names import name
from streamrl.operator.perimeter import build_network_policies, build_token_secret
from streamrl.operator.pods import minted_token
from streamrl.operator.reconcile import ForeignObject, apply_all
from streamrl.operator.runtime import Runtime
from streamrl.spec import API_VERSION, GROUP, RLJob
from streamrl.wire.addresses import join_host_port

ORPHAN_REMOTE = f"{GROUP}/orphan-remote"
"""Annotation on an RLJob: "true" lets its deletion finish without removing its pools from
clusters that cannot be reached (they are left running there)."""
REMOTE_KINDS = (("apps/v1", "Deployment"), ("v1", "ConfigMap"), ("v1", "Secret"),
                ("networking.k8s.io/v1", "NetworkPolicy"))

Logger = logging.Logger | logging.LoggerAdapter


def origin_labels(cluster_id: str, namespace: str, job: str) -> dict[str, str]:
    """Labels that mark an object made in another cluster for this cluster's job."""
    return {f"{GROUP}/origin-cluster": cluster_id, f"{GROUP}/origin-namespace": namespace,
            f"{GROUP}/origin-job": job}


def _origin_selector(origin: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in origin.items())


async def trainer_address(runtime: Runtime, job: RLJob, namespace: str) -> tuple[str | None, str | None]:
    """(host:port other clusters dial, or None with the reason)."""
    service = await runtime.kube.get(path_of("v1", "Service", namespace, name(job.metadata.name, "trainer")))
    if job.spec.trainer.service_type == "NodePort":
        host = job.spec.trainer.external_host
        ports = [p for p in (service or {}).get("spec", {}).get("ports", []) if p.get("name") == "grpc"]
        if not host:
            return None, ("trainer.serviceType NodePort needs trainer.externalHost (where other clusters reach "
                          "the nodes)")
        if not ports or not ports[0].get("nodePort"):
            return None, "waiting for the trainer Service's node port"
        return join_host_port(host, ports[0]["nodePort"]), None
    ingress = ((service or {}).get("status", {}).get("loadBalancer", {}).get("ingress") or [{}])[0]
    host = ingress.get("ip") or ingress.get("hostname")
    if not host:
        return None, "waiting for the trainer Service's external address"
    return join_host_port(host, TRAINER_GRPC_PORT), None  # an IPv6 load balancer: [address]:port


def remote_children(runtime: Runtime, job: RLJob, namespace: str, cluster: str, address: str,
                    token: str | None, finished: bool, held: bool = False) -> list[dict]:
    """What one remote cluster holds for the job: its spec, its token, its NetworkPolicy and
    the Deployment of each of the job's pools placed there."""
    origin = origin_labels(runtime.cluster_id, namespace, job.metadata.name)
    out = [build_configmap(job, namespace, origin=origin)]
    if minted_token(job):
        assert token is not None  # minted for such a job
        out.append(build_token_secret(job, namespace, token, origin=origin))
    if runtime.settings.network_policy:
        out += build_network_policies(job, namespace, runtime.settings, origin=origin)
    out += [build_generators(job, p.name, namespace, runtime.settings, address, origin=origin, finished=finished,
                             held=held)
            for p in job.spec.generators.pools if p.cluster_ref == cluster]
    return out


async def apply_remote(runtime: Runtime, job: RLJob, namespace: str, token: str | None, logger: Logger,
                       finished: bool = False, held: bool = False) -> str | None:
    """Create or update every pool that lives in another cluster, and prune there what the spec
    no longer places; the first problem, if any."""
    remote = sorted({p.cluster_ref for p in job.spec.generators.pools if p.cluster_ref})
    key = f"{namespace}/{job.metadata.name}"
    if remote:
        address, problem = await trainer_address(runtime, job, namespace)
        if problem:
            return problem
        assert address is not None  # one or the other
        for cluster in remote:
            client = runtime.clusters.get(cluster)
            pools = ", ".join(p.name for p in job.spec.generators.pools if p.cluster_ref == cluster)
            if client is None:
                return f"RLCluster {cluster!r} (pool {pools}) is not registered or not Active"
            if not runtime.cluster_allows(cluster, namespace):
                return (f"RLCluster {cluster!r} (pool {pools}) does not allow namespace {namespace} "
                        "(its spec.allowedNamespaces)")
            try:
                await apply_all(runtime, client, key,
                                remote_children(runtime, job, namespace, cluster, address, token, finished, held),
                                logger)
            except (KubeError, httpx.HTTPError, ForeignObject) as err:
                return f"RLCluster {cluster!r}: {err}"
    for cluster, client in list(runtime.clusters.items()):
        wanted = frozenset(name(job.metadata.name, "gen", p.name) for p in job.spec.generators.pools
                           if p.cluster_ref == cluster)
        if runtime.pruned.get((key, cluster)) == wanted:
            continue  # pruned for this spec already (runs again when it changes, or the operator restarts)
        try:
            await _prune(runtime, client, job.metadata.name, namespace, set(wanted), logger)
            runtime.pruned[(key, cluster)] = wanted
        except (KubeError, httpx.HTTPError) as err:
            logger.warning("could not prune the job's objects in cluster %s: %s", cluster, err)
    return None


async def _prune(runtime: Runtime, client: KubeClient, job: str, namespace: str, wanted_pools: set[str],
                 logger: Logger) -> None:
    """Delete the job's Deployments in `client`'s cluster that are not `wanted_pools`, and its
    other objects there once no pool is left."""
    marks = origin_labels(runtime.cluster_id, namespace, job)
    origin = _origin_selector(marks)
    for api_version, kind in REMOTE_KINDS:
        if kind == "Secret":  # never listed (the operator may not list Secrets): read by name, deleted if marked
            path = path_of("v1", "Secret", namespace, name(job, "token"))
            secret = None if wanted_pools else await client.get(path)
            labels = ((secret or {}).get("metadata") or {}).get("labels") or {}
            if secret is not None and all(labels.get(k) == v for k, v in marks.items()) and await client.delete(path):
                logger.info("deleted Secret %s in cluster %s: no pool of the job is left there", name(job, "token"),
                            client.name)
            continue
        for obj in await client.list(api_version, kind, namespace, origin):
            obj_name = obj["metadata"]["name"]
            if kind == "Deployment" and obj_name in wanted_pools or kind != "Deployment" and wanted_pools:
                continue
            if await client.delete(path_of(api_version, kind, namespace, obj_name)):
                logger.info("deleted %s %s in cluster %s: the spec no longer places it there", kind, obj_name,
                            client.name)


def has_remote_pools(spec: dict | None) -> bool:
    """Whether a raw spec names pools in other clusters (read before it is parsed: a job
    being deleted may no longer parse)."""
    return any((p or {}).get("clusterRef") for p in ((spec or {}).get("generators") or {}).get("pools") or [])


async def remove_remote(runtime: Runtime, body: dict, namespace: str, logger: Logger) -> str | None:
    """Delete what this job made in other clusters; the first cluster that could not be
    cleaned (it is tried again), or None once everything is removed or may be left. A pool
    whose RLCluster no longer exists is left (nothing can reach it), with a warning; with the
    annotation ORPHAN_REMOTE "true", so is one whose cluster cannot be reached."""
    job = body["metadata"]["name"]
    orphan = (body["metadata"].get("annotations") or {}).get(ORPHAN_REMOTE) == "true"
    refs = sorted({p.get("clusterRef") for p in body["spec"]["generators"]["pools"] if p.get("clusterRef")})
    for ref in refs:
        client = runtime.clusters.get(ref)
        if client is None:
            if await runtime.kube.get(path_of(API_VERSION, "RLCluster", None, ref)) is None:
                logger.warning("RLCluster %r no longer exists: the job's objects there (if any) are left", ref)
                continue
            if orphan:
                logger.warning("RLCluster %r is not reachable: its pool is left there (%s)", ref, ORPHAN_REMOTE)
                continue
            return (f"RLCluster {ref!r} is not reachable; its pool is kept until it is (annotate the RLJob "
                    f"{ORPHAN_REMOTE}=true to leave it there and finish the deletion)")
        try:
            await _prune(runtime, client, job, namespace, set(), logger)
        except (KubeError, httpx.HTTPError) as err:
            if orphan:
                logger.warning("RLCluster %r failed (%s): its pool is left there (%s)", ref, err, ORPHAN_REMOTE)
                continue
            return (f"RLCluster {ref!r}: {err}; its pool is kept until it can be removed (annotate the RLJob "
                    f"{ORPHAN_REMOTE}=true to leave it there)")
    return None
