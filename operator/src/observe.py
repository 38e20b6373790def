"""What the operator sees of one RLJob: its children (in this cluster and in registered
ones) and its trainer's /status, parsed through streamrl.records.TrainerStatus, as the
phase machine's Observed. Reads only; decides nothing."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import httpx
from pydantic import ValidationError

from streamrl.operator.builders import ADMIN_PORT, generator_selector, name, uses_ranker
from streamrl.operator.kube import KubeError, path_of
from streamrl.operator.phases import Observed, TrainerGroup
from streamrl.records import TrainerStatus
from streamrl.spec import RLJob

if TYPE_CHECKING:
    from streamrl.operator.runtime import Runtime

log = logging.getLogger("streamrl.operator")


async def fetch_trainer_status(job: str, namespace: str) -> dict | None:
    """The trainer's /status body through its Service (None while it cannot be reached)."""
    try:
        async with httpx.AsyncClient(timeout=2.0) as http:
            reply = await http.get(f"http://{name(job, 'trainer')}.{namespace}.svc:{ADMIN_PORT}/status")
            return reply.json() if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def read_trainer_status(body: object) -> tuple[TrainerStatus | None, str | None]:
    """(the parsed /status, None), or (None, why it is unreadable: each field and its
    problem). A body that does not parse is never half-read."""
    try:
        return TrainerStatus.model_validate(body), None
    except ValidationError as err:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or '<body>'}: {e['msg']}" for e in err.errors()]
        return None, "; ".join(problems)


async def _trainer(runtime: Runtime, job: str, namespace: str) -> tuple[TrainerStatus | None, str | None]:
    body = await runtime.trainer_status(job, namespace)
    key = f"{namespace}/{job}"
    if body is None:
        return None, None
    status, unreadable = read_trainer_status(body)
    if unreadable is None:
        runtime.unreadable.pop(key, None)
    elif runtime.unreadable.get(key) != unreadable:
        runtime.unreadable[key] = unreadable
        log.warning("RLJob %s: the trainer's /status is unreadable (a trainer of another version?): %s",
                    key, unreadable)
    return status, unreadable


def _scaling_limited(job: RLJob, status: dict | None) -> tuple[str, str] | None:
    """What the autoscaler last said limits it (status.autoscaling.limited), when it runs."""
    limited = ((status or {}).get("autoscaling") or {}).get("limited")
    if job.spec.autoscaling.mode != "Internal" or not limited:
        return None
    return limited.get("reason", "Limited"), limited.get("message", "")


async def _ready_replicas(client, path: str) -> int:
    try:
        d = await client.get(path)
    except (KubeError, httpx.HTTPError):
        return 0
    return int(((d or {}).get("status") or {}).get("readyReplicas") or 0)


async def observe(runtime: Runtime, job: RLJob, namespace: str, generation: int, cluster_problem: str | None,
                  status: dict | None = None, group: TrainerGroup | None = None,
                  claim_problem: str | None = None) -> Observed:
    """Everything the phase machine needs about one RLJob (`status`: its current status;
    `group`: what was just done to its trainer Job; `claim_problem`: why its checkpoint
    claim cannot be mounted yet)."""
    j = job.metadata.name
    replicas = job.spec.generators.pool_replicas()
    pools = []
    for pool in job.spec.generators.pools:
        client = runtime.clusters.get(pool.cluster_ref) if pool.cluster_ref else runtime.kube
        path = path_of("apps/v1", "Deployment", namespace, name(j, "gen", pool.name))
        ready = await _ready_replicas(client, path) if client is not None else 0
        pools.append({"name": pool.name, "cluster": pool.cluster_ref or "", "replicas":
                      0 if job.spec.suspend else replicas[pool.name], "readyReplicas": ready})
    if group is not None:  # the Job as ensure_trainer saw it and acted on it
        job_status = group.job_status
    else:
        job_status = ((await runtime.kube.get(path_of("batch/v1", "Job", namespace, name(j, "trainer")))) or {}
                      ).get("status")
    trainer, unreadable = await _trainer(runtime, j, namespace)
    ranker = None
    if uses_ranker(job):
        d = await runtime.kube.get(path_of("apps/v1", "Deployment", namespace, name(j, "ranker")))
        ranker = {"ready": bool(((d or {}).get("status") or {}).get("readyReplicas"))}
    pods = (int((job_status or {}).get("ready") or 0),
            0 if job.spec.suspend else job.spec.trainer.nodes)
    return Observed(generation=generation, suspended=job.spec.suspend, trainer_group=group, trainer_pods=pods,
                    trainer_job=job_status, trainer=trainer, trainer_unreadable=unreadable,
                    pools=pools, cluster_problem=cluster_problem, claim_problem=claim_problem, ranker=ranker,
                    label_selector=generator_selector(j), scaling_limited=_scaling_limited(job, status))
