"""The kopf handlers: thin, over the pure builders (builders.py) and the phase machine
(status.py). All I/O goes through the Runtime in kopf's memo, so tests run the real
handlers against an emulated API server.

RLJob: create/resume/spec change -> apply every child (in the job's cluster with owner
references; in a registered cluster with origin labels), prune what the spec no longer
asks for, write the status. A timer refreshes the status from the children and the
trainer's /status. A daemon per RLJob runs the autoscaler (operator/scaling.py) every
spec.autoscaling.intervalSeconds: it reads Prometheus and patches the pools' replicas, which
the spec handler then applies. Deletion: children in other clusters are removed through a finalizer
(owner references cannot cross clusters). RLCluster: the kubeconfig Secret is checked and
the cluster probed; the result is its status.
"""

from __future__ import annotations

import base64
import datetime
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import kopf
import kubernetes_validate
import yaml

from streamrl.metrics import AutoscalerMetrics
from streamrl.operator import scaling as autoscaler
from streamrl.operator.builders import (
    ADMIN_PORT,
    TRAINER_GRPC_PORT,
    Settings,
    build_children,
    build_configmap,
    build_generators,
    generator_selector,
    name,
    owner_reference,
    uses_ranker,
)
from streamrl.operator.kube import KubeClient, KubeError, kubeconfig_problems, path_of
from streamrl.operator.status import Observed, derive
from streamrl.prometheus.api import PrometheusAPI, PrometheusError
from streamrl.scaling.inputs import input_queries, parse_inputs, query_window_s
from streamrl.spec import RLJob, SpecError, parse_job

log = logging.getLogger("streamrl.operator")
GROUP, VERSION = "streamrl.io", "v1alpha1"
RLJOBS, RLCLUSTERS = (GROUP, VERSION, "rljobs"), (GROUP, VERSION, "rlclusters")
KUBERNETES_VERSION = "1.33"
"""Schemas free-form parts are checked against."""
STATUS_INTERVAL_S = float(os.environ.get("STREAMRL_OPERATOR_STATUS_INTERVAL_S", "10"))
"""How often each RLJob's status is refreshed from its children and its trainer."""


async def fetch_trainer_status(job: str, namespace: str) -> dict | None:
    """The trainer's /status through its Service (None while it cannot be reached)."""
    try:
        async with httpx.AsyncClient(timeout=2.0) as http:
            reply = await http.get(f"http://{name(job, 'trainer')}.{namespace}.svc:{ADMIN_PORT}/status")
            return reply.json() if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


@dataclass
class Runtime:
    """Everything the handlers do I/O with."""

    kube: KubeClient
    settings: Settings = field(default_factory=Settings)
    namespace: str = "streamrl-system"
    """The operator's own namespace (kubeconfig Secrets of RLClusters live there)."""
    clusters: dict[str, KubeClient] = field(default_factory=dict)
    """Registered remote clusters by RLCluster name, once their kubeconfig checked out."""
    cluster_id: str = "home"
    """This cluster's name in origin labels of remote objects."""
    trainer_status: Callable[[str, str], Awaitable[dict | None]] = fetch_trainer_status
    retry_delay_s: float = 15.0
    """Before trying again what waits on another party (a cluster, a load balancer)."""
    prometheus_url: str = ""
    """The Prometheus HTTP API autoscaled jobs read unless they name their own."""
    metrics: AutoscalerMetrics = field(default_factory=AutoscalerMetrics)
    """The autoscaler's series, served on the operator's metrics port."""
    scaling: dict[str, autoscaler.Memory] = field(default_factory=dict)
    """The autoscaler's memory per RLJob ("namespace/name")."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(body) -> RLJob:
    return parse_job({"apiVersion": body.get("apiVersion", f"{GROUP}/{VERSION}"), "kind": "RLJob",
                      "metadata": {"name": body["metadata"]["name"]}, "spec": dict(body.get("spec") or {})},
                     source=f"rljob/{body['metadata']['name']}")


def _validate(objects: list[dict]) -> None:
    """Free-form parts (pod templates, tolerations, resources) end up in these objects:
    check them against Kubernetes's own schemas before anything is applied."""
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            raise SpecError(f"the {obj['kind']} for {obj['metadata']['name']} would be invalid at "
                            f"{err.json_path}: {err.message} (check that role's placement)") from None


def _origin(runtime: Runtime, namespace: str, job: str) -> dict[str, str]:
    return {"streamrl.io/origin-cluster": runtime.cluster_id, "streamrl.io/origin-namespace": namespace,
            "streamrl.io/origin-job": job}


async def _trainer_address(runtime: Runtime, job: RLJob, namespace: str) -> tuple[str | None, str | None]:
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


async def _apply_remote(runtime: Runtime, job: RLJob, namespace: str) -> str | None:
    """Create or update every pool that lives in another cluster; the first problem, if any."""
    remote = [p for p in job.spec.generators.pools if p.cluster_ref]
    if not remote:
        return None
    address, problem = await _trainer_address(runtime, job, namespace)
    if problem:
        return problem
    origin = _origin(runtime, namespace, job.metadata.name)
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


async def _prune(runtime: Runtime, job: RLJob, namespace: str) -> None:
    """Delete local generator pools and the ranker the spec no longer asks for."""
    j = job.metadata.name
    wanted = {name(j, "gen", p.name) for p in job.spec.generators.pools if not p.cluster_ref}
    for d in await runtime.kube.list("apps/v1", "Deployment", namespace, generator_selector(j)):
        if d["metadata"]["name"] not in wanted:
            await runtime.kube.delete(path_of("apps/v1", "Deployment", namespace, d["metadata"]["name"]))
    if not uses_ranker(job):
        await runtime.kube.delete(path_of("apps/v1", "Deployment", namespace, name(j, "ranker")))
        await runtime.kube.delete(path_of("v1", "Service", namespace, name(j, "ranker")))


def _scaling_limited(job: RLJob, status) -> tuple[str, str] | None:
    """What the autoscaler last said limits it (status.autoscaling.limited), when it runs."""
    limited = ((status or {}).get("autoscaling") or {}).get("limited")
    if job.spec.autoscaling.mode != "Internal" or not limited:
        return None
    return limited.get("reason", "Limited"), limited.get("message", "")


async def _observe(runtime: Runtime, job: RLJob, namespace: str, generation: int, cluster_problem: str | None,
                   status=None):
    j = job.metadata.name
    replicas = job.spec.generators.pool_replicas()
    pools = []
    for pool in job.spec.generators.pools:
        client = runtime.clusters.get(pool.cluster_ref) if pool.cluster_ref else runtime.kube
        ready = 0
        if client is not None:
            try:
                d = await client.get(path_of("apps/v1", "Deployment", namespace, name(j, "gen", pool.name)))
                ready = int(((d or {}).get("status") or {}).get("readyReplicas") or 0)
            except (KubeError, httpx.HTTPError):
                ready = 0
        pools.append({"name": pool.name, "cluster": pool.cluster_ref or "", "replicas":
                      0 if job.spec.suspend else replicas[pool.name], "readyReplicas": ready})
    trainer_job = await runtime.kube.get(path_of("batch/v1", "Job", namespace, name(j, "trainer")))
    trainer = await runtime.trainer_status(j, namespace)
    ranker = None
    if uses_ranker(job):
        d = await runtime.kube.get(path_of("apps/v1", "Deployment", namespace, name(j, "ranker")))
        ranker = {"ready": bool(((d or {}).get("status") or {}).get("readyReplicas"))}
    return Observed(generation=generation, suspended=job.spec.suspend,
                    trainer_job=(trainer_job or {}).get("status"), trainer=trainer, pools=pools,
                    cluster_problem=cluster_problem, ranker=ranker, label_selector=generator_selector(j),
                    scaling_limited=_scaling_limited(job, status))


@kopf.on.resume(*RLJOBS)
@kopf.on.create(*RLJOBS)
@kopf.on.update(*RLJOBS, field="spec")
async def reconcile_rljob(body, meta, namespace, status, patch, memo, logger, **_):
    runtime: Runtime = memo.runtime
    generation = int(meta.get("generation") or 1)
    previous = (status or {}).get("conditions")
    try:
        job = _parse(body)
        children = build_children(job, namespace, runtime.settings, owner_reference(body))
        _validate(children)
    except SpecError as err:
        logger.warning("invalid RLJob: %s", err)
        patch.status.update(derive(Observed(generation=generation, invalid=str(err)), previous, _now()))
        return  # not retried: a new spec brings a new attempt
    for obj in children:
        action, _ = await runtime.kube.apply(obj)
        logger.debug("%s %s/%s", action, obj["kind"], obj["metadata"]["name"])
    await _prune(runtime, job, namespace)
    problem = await _apply_remote(runtime, job, namespace)
    patch.status.update(derive(await _observe(runtime, job, namespace, generation, problem, status), previous,
                               _now()))
    if problem:
        raise kopf.TemporaryError(problem, delay=runtime.retry_delay_s)


@kopf.timer(*RLJOBS, interval=STATUS_INTERVAL_S, initial_delay=STATUS_INTERVAL_S / 2)
async def refresh_rljob_status(body, meta, namespace, status, patch, memo, **_):
    runtime: Runtime = memo.runtime
    generation = int(meta.get("generation") or 1)
    status = status or {}
    if status.get("phase") == "Invalid" or status.get("observedGeneration") != generation:
        return  # the spec handler has not applied this generation yet (it writes the status then)
    try:
        job = _parse(body)
    except SpecError:
        return
    conditions = status.get("conditions") or []
    # The cluster problem is the spec handler's finding (it retries until it clears); keep it.
    problem = next((c.get("message") or None for c in conditions
                    if c["type"] == "ClustersReady" and c["status"] == "False"), None)
    patch.status.update(derive(await _observe(runtime, job, namespace, generation, problem, status), conditions,
                               _now()))


async def _scaling_round(runtime: Runtime, job: RLJob, namespace: str, status: dict,
                         memory: autoscaler.Memory) -> autoscaler.Outcome:
    """Read the inputs from Prometheus (the job's series: scraped through the chart's
    PodMonitor they carry its namespace) and plan; what cannot be read is said, not raised."""
    previous = status.get("autoscaling")
    try:
        url = autoscaler.prometheus_url(job, runtime.prometheus_url)
    except ValueError as err:
        return autoscaler.waiting(memory, None, str(err), previous, problem=True)
    skip = autoscaler.skip_reason(job, status.get("phase"))
    if skip:
        return autoscaler.waiting(memory, url, skip, previous)
    now = time.time()
    window = query_window_s(now, memory.settled_at, job.spec.autoscaling.interval_seconds)
    queries = input_queries(job.metadata.name, window, namespace)
    try:
        results = await PrometheusAPI(url).aquery_all(queries)
    except PrometheusError as err:
        interval = job.spec.autoscaling.interval_seconds
        return autoscaler.waiting(memory, url, f"cannot read the scaling inputs (next try in {interval}s): {err}",
                                  previous, problem=True)
    return autoscaler.plan(job, parse_inputs(results), memory, now, url, previous)


async def _autoscale(runtime: Runtime, namespace: str, job_name: str, logger) -> float:
    """One autoscaler round for one RLJob: patch the replicas, post Events, record metrics,
    write status.autoscaling. Returns the seconds until the next round."""
    path = path_of(f"{GROUP}/{VERSION}", "RLJob", namespace, job_name)
    body = await runtime.kube.get(path)
    try:
        job = _parse(body) if body else None
    except SpecError:
        job = None  # the spec handler reports it
    if job is None:
        return STATUS_INTERVAL_S
    key, status = f"{namespace}/{job_name}", body.get("status") or {}
    previous, mode = status.get("autoscaling"), job.spec.autoscaling.mode
    new = autoscaler.external_status() if mode == "External" else None  # Disabled: none
    if mode != "Internal":
        runtime.scaling.pop(key, None)
    else:
        memory = runtime.scaling.get(key) or autoscaler.Memory.from_status(previous)
        result = await _scaling_round(runtime, job, namespace, status, memory)
        if result.replicas is not None:
            try:
                await runtime.kube.patch(path, autoscaler.scale_patch(body, result.replicas))
            except KubeError as err:  # e.g. 409: the spec changed since it was read; the next round decides again
                logger.warning("autoscaler: replicas not written: %s", err)
                return job.spec.autoscaling.interval_seconds
        for kind, reason, message in result.events:
            kopf.event(body, type=kind, reason=reason, message=message)
        if result.decision is not None:
            d = result.decision
            runtime.metrics.record(job_name, d.replicas, d.step, d.pool, d.trainer_bound)
        runtime.scaling[key] = result.memory
        new = result.status
        if new["message"] != (previous or {}).get("message"):
            logger.log(logging.WARNING if result.problem else logging.INFO, "autoscaler: %s", new["message"])
    patch = autoscaler.status_patch(previous, new)
    if patch:
        await runtime.kube.patch(f"{path}/status", patch)
    return job.spec.autoscaling.interval_seconds


@kopf.daemon(*RLJOBS, cancellation_backoff=2.0, cancellation_timeout=5.0)
async def autoscale_rljob(name, namespace, memo, logger, stopped, **_):
    """Every spec.autoscaling.intervalSeconds, one autoscaler round (it does nothing unless
    mode is Internal, and says so in status.autoscaling when External)."""
    runtime: Runtime = memo.runtime
    try:
        while not stopped:
            try:
                delay = await _autoscale(runtime, namespace, name, logger)
            except (KubeError, httpx.HTTPError) as err:
                logger.warning("autoscaler: the API server failed: %s; next try in %.0fs", err, STATUS_INTERVAL_S)
                delay = STATUS_INTERVAL_S
            await stopped.wait(delay)
    finally:
        runtime.scaling.pop(f"{namespace}/{name}", None)


def _has_remote_pools(spec, **_) -> bool:
    return any((p or {}).get("clusterRef") for p in ((spec or {}).get("generators") or {}).get("pools") or [])


@kopf.on.delete(*RLJOBS, when=_has_remote_pools)
async def delete_remote_children(body, namespace, memo, logger, **_):
    """Owner references cannot cross clusters: remove what this job made elsewhere."""
    runtime: Runtime = memo.runtime
    j = body["metadata"]["name"]
    for pool in body["spec"]["generators"]["pools"]:
        ref = pool.get("clusterRef")
        if not ref:
            continue
        client = runtime.clusters.get(ref)
        if client is None:
            raise kopf.TemporaryError(f"RLCluster {ref!r} is not reachable; its pool {pool['name']} is kept "
                                      "until it is", delay=runtime.retry_delay_s)
        await client.delete(path_of("apps/v1", "Deployment", namespace, name(j, "gen", pool["name"])))
        await client.delete(path_of("v1", "ConfigMap", namespace, name(j, "spec")))
        logger.info("removed pool %s from cluster %s", pool["name"], ref)


@kopf.on.resume(*RLCLUSTERS)
@kopf.on.create(*RLCLUSTERS)
@kopf.on.update(*RLCLUSTERS, field="spec")
async def register_cluster(body, spec, patch, memo, logger, **_):
    runtime: Runtime = memo.runtime
    cluster = body["metadata"]["name"]
    ref = spec.get("kubeconfigSecretRef") or {}
    secret = await runtime.kube.get(path_of("v1", "Secret", runtime.namespace, ref.get("name", "")))
    problems, version = [], None
    if secret is None:
        problems = [f"Secret {runtime.namespace}/{ref.get('name')} not found"]
    else:
        raw = (secret.get("data") or {}).get(ref.get("key", "kubeconfig"))
        if raw is None:
            problems = [f"Secret {ref.get('name')} has no key {ref.get('key', 'kubeconfig')!r}"]
        else:
            try:
                config = yaml.safe_load(base64.b64decode(raw))
            except (ValueError, yaml.YAMLError) as err:
                config, problems = None, [f"kubeconfig is not YAML: {err}"]
            problems = problems or kubeconfig_problems(config)
            if not problems:
                client = KubeClient.from_kubeconfig(config, cluster)
                try:
                    version = (await client.version()).get("gitVersion", "")
                    runtime.clusters[cluster] = client
                except (KubeError, httpx.HTTPError) as err:
                    problems = [f"cannot reach {client.server}: {err}"]
    active = not problems
    if not active:
        runtime.clusters.pop(cluster, None)
    patch.status.update({
        "phase": "Active" if active else "Inactive",
        "message": "; ".join(problems) or f"reachable, Kubernetes {version}",
        "conditions": [{"type": "Active", "status": "True" if active else "False",
                        "reason": "Reachable" if active else ("InvalidKubeconfig" if secret else "SecretMissing"),
                        "message": "; ".join(problems), "lastTransitionTime": _now()}],
    })
    if not active:
        logger.warning("RLCluster %s inactive: %s", cluster, "; ".join(problems))


@kopf.on.delete(*RLCLUSTERS, optional=True)
async def forget_cluster(body, memo, **_):
    client = memo.runtime.clusters.pop(body["metadata"]["name"], None)
    if client is not None:
        await client.close()
