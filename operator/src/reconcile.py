"""Making the clusters match an RLJob: parse its body, check the built children against
Kubernetes's own schemas, apply them, supervise the trainer group (restarts within the
budget, preemptions free), keep the checkpoint claim, prune what the spec no longer asks
for, and create or update the pools that live in registered clusters (by origin labels,
since owner references cannot cross clusters). Knows no phase: it returns what went wrong."""

from __future__ import annotations

import logging
import re

import httpx
import kubernetes_validate

from streamrl.operator.builders import (
    PREEMPTED_EXIT_CODE,
    RESTARTS,
    TEMPLATE_HASH,
    TRAINER_GRPC_PORT,
    build_configmap,
    build_generators,
    claim_name,
    generator_selector,
    name,
    uses_ranker,
)
from streamrl.operator.kube import KubeError, path_for, path_of
from streamrl.operator.phases import TrainerGroup
from streamrl.operator.runtime import Runtime
from streamrl.operator.settings import Settings
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


def restart_budget(job: RLJob, settings: Settings) -> int:
    """Whole-group restarts of a failed trainer before the job fails: spec.trainer.restartLimit,
    else the operator's STREAMRL_TRAINER_BACKOFF_LIMIT."""
    limit = job.spec.trainer.restart_limit
    return settings.trainer_backoff_limit if limit is None else limit


_PREEMPTED = re.compile(rf"\bexit code {PREEMPTED_EXIT_CODE}\b")


def preemption(failed: dict, suspended: bool) -> str | None:
    """Why a failed trainer Job was stopped from outside rather than broken (its restart is
    free), or None (it counts against the budget). `failed`: the Job's Failed condition, whose
    message names the pod failure policy's rule that matched (see builders.build_trainer)."""
    if suspended:
        return "stopped while suspended"
    if failed.get("reason") != "PodFailurePolicy":
        return None
    message = failed.get("message") or ""
    if _PREEMPTED.search(message):
        return f"preempted: the trainer saved a checkpoint and exited {PREEMPTED_EXIT_CODE}"
    if "condition DisruptionTarget" in message:
        return "disrupted: a trainer pod was evicted, preempted or its node drained"
    return None


async def ensure_trainer(runtime: Runtime, desired: dict, restarts: int, budget: int,
                         logger: logging.Logger | logging.LoggerAdapter, preemptions: int = 0) -> TrainerGroup:
    """Make the trainer Job match `desired`, a whole group at a time. A Job cannot change its
    pods once created: a new template (the spec changed) replaces the Job and its pods (a new
    spec is a new attempt: the counts start again from 0); a failed Job (any one pod failing
    fails it) is deleted and created again, every pod at once: free when it was stopped from
    outside (a preemption, see `preemption`), else while `restarts` < `budget`.
    Deletion is in the foreground: the new Job is created once the old one and its pods are
    gone, so no new rank meets an old one at the rendezvous."""
    path = path_for(desired)
    current = await runtime.kube.get(path)
    if current is None:
        desired["metadata"]["annotations"][RESTARTS] = str(restarts)
        await runtime.kube.create(desired)
        logger.info("created the trainer Job %s (group restarts so far: %d)", desired["metadata"]["name"], restarts)
        return TrainerGroup("created", restarts, preemptions=preemptions)
    seen = current.get("status") or {}
    if current["metadata"].get("deletionTimestamp"):
        return TrainerGroup("waiting", restarts, "waiting for the previous trainer Job and its pods to be deleted",
                            seen, preemptions)
    if job_condition(current, "Complete"):
        return TrainerGroup("finished", restarts, job_status=seen, preemptions=preemptions)
    wanted = desired["metadata"]["annotations"][TEMPLATE_HASH]
    if (current["metadata"].get("annotations") or {}).get(TEMPLATE_HASH) != wanted:
        await runtime.kube.delete(path, propagation="Foreground")
        logger.info("the trainer's pod template changed: replacing the whole trainer group")
        return TrainerGroup("rolling", 0, "replacing the trainer group for the new spec", seen)
    failed = job_condition(current, "Failed")
    if failed:
        why = failed.get("message") or failed.get("reason") or "a trainer pod failed"
        free = preemption(failed, bool((current.get("spec") or {}).get("suspend")))
        if free:
            await runtime.kube.delete(path, propagation="Foreground")
            logger.info("the trainer group was %s (%s): restarting every rank, not counted against the restart "
                        "budget", free, why)
            return TrainerGroup("restarting", restarts, f"restarting the trainer group, {free} (not counted "
                                                        f"against the restart budget): {why}", seen, preemptions + 1)
        if restarts >= budget:
            return TrainerGroup("failed", restarts, f"the trainer group failed after {restarts} restart(s) "
                                                    f"(budget {budget}): {why}", seen, preemptions)
        await runtime.kube.delete(path, propagation="Foreground")
        logger.warning("the trainer group failed (%s): restarting every rank (restart %d of %d)", why,
                       restarts + 1, budget)
        return TrainerGroup("restarting", restarts + 1,
                            f"restarting the trainer group (restart {restarts + 1} of {budget}): {why}", seen,
                            preemptions)
    desired["metadata"]["annotations"][RESTARTS] = current["metadata"]["annotations"].get(RESTARTS, str(restarts))
    action, _ = await runtime.kube.apply(desired)  # what a Job may change: suspend
    return TrainerGroup(action, restarts, job_status=seen, preemptions=preemptions)


async def ensure_claim(runtime: Runtime, job: RLJob, namespace: str, desired: dict | None, owner: dict | None,
                       logger: logging.Logger | logging.LoggerAdapter) -> str | None:
    """The checkpoint claim: created once when the operator makes it (`desired`; its spec is
    the cluster's afterwards: a bound claim's size and mode are not the operator's to change),
    its owner reference following `retain`; an existing claim (claimName) only looked for.
    Returns why the trainer's pods cannot mount it yet (None: they can, or there is no volume)."""
    claim = claim_name(job)
    if claim is None:
        return None
    path = path_of("v1", "PersistentVolumeClaim", namespace, claim)
    current = await runtime.kube.get(path)
    if current is not None and current["metadata"].get("deletionTimestamp"):
        return f"waiting for the previous PersistentVolumeClaim {claim} to be deleted (checkpoint.volume)"
    if desired is None:
        return None if current is not None else (
            f"checkpoint.volume.claimName: PersistentVolumeClaim {claim!r} not found in namespace {namespace}; "
            "the trainer's pods wait for it")
    if current is None:
        await runtime.kube.create(desired)
        logger.info("created the checkpoint claim %s (%s, %s)", claim, desired["spec"]["resources"]["requests"]
                    ["storage"], desired["spec"]["accessModes"][0])
        return None
    owners = desired["metadata"].get("ownerReferences")
    ours = [o for o in current["metadata"].get("ownerReferences") or [] if owner and o.get("uid") == owner["uid"]]
    if bool(owners) != bool(ours):  # retain changed: the garbage collector keeps it, or takes it with the job
        await runtime.kube.patch(path, {"metadata": {"ownerReferences": owners}})
        logger.info("checkpoint claim %s: %s", claim, "deleted with the job" if owners else "kept after the job")
    return None


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
