"""Making the clusters match an RLJob: parse its body, check the built children against
Kubernetes's own schemas, apply them, prune what the spec no longer asks for, and create
or update the pools that live in registered clusters (by origin labels, since owner
references cannot cross clusters). Knows no phase: it returns what went wrong."""

from __future__ import annotations

import logging

import httpx
import kubernetes_validate

from streamrl.operator.builders import (
    RESTARTS,
    TEMPLATE_HASH,
    TRAINER_GRPC_PORT,
    build_configmap,
    build_generators,
    generator_selector,
    name,
    uses_ranker,
)
from streamrl.operator.kube import KubeError, path_for, path_of
from streamrl.operator.phases import TrainerGroup
from streamrl.operator.runtime import Runtime
from streamrl.spec import API_VERSION, GROUP, KIND, RLJob, SpecError, parse_job

KUBERNETES_VERSION = "1.33"
"""Schemas free-form parts are checked against."""


def job_of(body) -> RLJob:
    """The RLJob a kopf body holds; SpecError naming each bad field."""
    meta_name = body["metadata"]["name"]
    return parse_job({"apiVersion": body.get("apiVersion", API_VERSION), "kind": KIND,
                      "metadata": {"name": meta_name}, "spec": dict(body.get("spec") or {})},
                     source=f"rljob/{meta_name}")


def validate(objects: list[dict]) -> None:
    """Free-form parts (pod templates, tolerations, resources) end up in these objects:
    check them against Kubernetes's own schemas before anything is applied."""
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            raise SpecError(f"the {obj['kind']} for {obj['metadata']['name']} would be invalid at "
                            f"{err.json_path}: {err.message} (check that role's placement)") from None


async def apply(runtime: Runtime, objects: list[dict], logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Create or update each object in this cluster."""
    for obj in objects:
        action, _ = await runtime.kube.apply(obj)
        logger.debug("%s %s/%s", action, obj["kind"], obj["metadata"]["name"])


def job_condition(job: dict | None, kind: str) -> dict | None:
    """The Job's condition `kind` when True (Complete, Failed...), else None."""
    return next((c for c in ((job or {}).get("status") or {}).get("conditions") or []
                 if c.get("type") == kind and c.get("status") == "True"), None)


async def ensure_trainer(runtime: Runtime, desired: dict, restarts: int, budget: int,
                         logger: logging.Logger | logging.LoggerAdapter) -> TrainerGroup:
    """Make the trainer Job match `desired`, a whole group at a time. A Job cannot change its
    pods once created: a new template (the spec changed) replaces the Job and its pods (a new
    spec is a new attempt: restarts start again from 0); a failed Job (any one pod failing
    fails it) is deleted and created again, every pod at once, while `restarts` < `budget`.
    Deletion is in the foreground: the new Job is created once the old one and its pods are
    gone, so no new rank meets an old one at the rendezvous."""
    path = path_for(desired)
    current = await runtime.kube.get(path)
    if current is None:
        desired["metadata"]["annotations"][RESTARTS] = str(restarts)
        await runtime.kube.create(desired)
        logger.info("created the trainer Job %s (group restarts so far: %d)", desired["metadata"]["name"], restarts)
        return TrainerGroup("created", restarts)
    seen = current.get("status") or {}
    if current["metadata"].get("deletionTimestamp"):
        return TrainerGroup("waiting", restarts, "waiting for the previous trainer Job and its pods to be deleted",
                            seen)
    if job_condition(current, "Complete"):
        return TrainerGroup("finished", restarts, job_status=seen)
    wanted = desired["metadata"]["annotations"][TEMPLATE_HASH]
    if (current["metadata"].get("annotations") or {}).get(TEMPLATE_HASH) != wanted:
        await runtime.kube.delete(path, propagation="Foreground")
        logger.info("the trainer's pod template changed: replacing the whole trainer group")
        return TrainerGroup("rolling", 0, "replacing the trainer group for the new spec", seen)
    failed = job_condition(current, "Failed")
    if failed:
        why = failed.get("message") or failed.get("reason") or "a trainer pod failed"
        if restarts >= budget:
            return TrainerGroup("failed", restarts, f"the trainer group failed after {restarts} restart(s) "
                                                    f"(budget {budget}): {why}", seen)
        await runtime.kube.delete(path, propagation="Foreground")
        logger.warning("the trainer group failed (%s): restarting every rank (restart %d of %d)", why,
                       restarts + 1, budget)
        return TrainerGroup("restarting", restarts + 1,
                            f"restarting the trainer group (restart {restarts + 1} of {budget}): {why}", seen)
    desired["metadata"]["annotations"][RESTARTS] = current["metadata"]["annotations"].get(RESTARTS, str(restarts))
    action, _ = await runtime.kube.apply(desired)  # what a Job may change: suspend
    return TrainerGroup(action, restarts, job_status=seen)


def origin_labels(cluster_id: str, namespace: str, job: str) -> dict[str, str]:
    """Labels that mark an object made in another cluster for this cluster's job."""
    return {f"{GROUP}/origin-cluster": cluster_id, f"{GROUP}/origin-namespace": namespace,
            f"{GROUP}/origin-job": job}


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
        return f"{host}:{ports[0]['nodePort']}", None
    ingress = ((service or {}).get("status", {}).get("loadBalancer", {}).get("ingress") or [{}])[0]
    host = ingress.get("ip") or ingress.get("hostname")
    if not host:
        return None, "waiting for the trainer Service's external address"
    return f"{host}:{TRAINER_GRPC_PORT}", None


async def apply_remote(runtime: Runtime, job: RLJob, namespace: str) -> str | None:
    """Create or update every pool that lives in another cluster; the first problem, if any."""
    remote = [p for p in job.spec.generators.pools if p.cluster_ref]
    if not remote:
        return None
    address, problem = await trainer_address(runtime, job, namespace)
    if problem:
        return problem
    origin = origin_labels(runtime.cluster_id, namespace, job.metadata.name)
    for pool in remote:
        client = runtime.clusters.get(pool.cluster_ref)
        if client is None:
            return f"RLCluster {pool.cluster_ref!r} (pool {pool.name}) is not registered or not Active"
        configmap = build_configmap(job, namespace)
        configmap["metadata"]["labels"].update(origin)
        deployment = build_generators(job, pool.name, namespace, runtime.settings, address, origin=origin)
        try:
            await client.apply(configmap)
            await client.apply(deployment)
        except (KubeError, httpx.HTTPError) as err:
            return f"RLCluster {pool.cluster_ref!r}: {err}"
    return None


async def prune(runtime: Runtime, job: RLJob, namespace: str) -> None:
    """Delete local generator pools and the ranker the spec no longer asks for."""
    j = job.metadata.name
    wanted = {name(j, "gen", p.name) for p in job.spec.generators.pools if not p.cluster_ref}
    for d in await runtime.kube.list("apps/v1", "Deployment", namespace, generator_selector(j)):
        if d["metadata"]["name"] not in wanted:
            await runtime.kube.delete(path_of("apps/v1", "Deployment", namespace, d["metadata"]["name"]))
    if not uses_ranker(job):
        await runtime.kube.delete(path_of("apps/v1", "Deployment", namespace, name(j, "ranker")))
        await runtime.kube.delete(path_of("v1", "Service", namespace, name(j, "ranker")))


def has_remote_pools(spec: dict | None) -> bool:
    """Whether a raw spec names pools in other clusters (read before it is parsed: a job
    being deleted may no longer parse)."""
    return any((p or {}).get("clusterRef") for p in ((spec or {}).get("generators") or {}).get("pools") or [])


async def remove_remote(runtime: Runtime, job: str, namespace: str, spec: dict,
                        logger: logging.Logger | logging.LoggerAdapter) -> str | None:
    """Delete what this job made in other clusters; the first cluster that cannot be
    reached (its pool is kept until it can), or None once all is removed."""
    for pool in spec["generators"]["pools"]:
        ref = pool.get("clusterRef")
        if not ref:
            continue
        client = runtime.clusters.get(ref)
        if client is None:
            return f"RLCluster {ref!r} is not reachable; its pool {pool['name']} is kept until it is"
        await client.delete(path_of("apps/v1", "Deployment", namespace, name(job, "gen", pool["name"])))
        await client.delete(path_of("v1", "ConfigMap", namespace, name(job, "spec")))
        logger.info("removed pool %s from cluster %s", pool["name"], ref)
    return None
