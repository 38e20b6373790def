"""What the operator sees of one RLJob: its children (in this cluster and in registered
ones), its pods' troubles (unschedulable, image pulls, admission refusals, crash loops: from
the pods' conditions and the namespace's Events) and its trainer's /status, parsed through
streamrl.records.TrainerStatus, as the phase machine's Observed. Reads only; decides nothing."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import httpx
from pydantic import ValidationError

from streamrl.operator.builders import uses_ranker
from streamrl.operator.kube import KubeError, path_of
from streamrl.operator.names import ADMIN_PORT, generator_selector, name, selector, serialized
from streamrl.operator.phases import JobPhase, Observed, TrainerGroup
from streamrl.operator.sources import COPY_CONTAINER, FETCH_CONTAINER
from streamrl.records import TrainerStatus
from streamrl.spec import RLJob

if TYPE_CHECKING:
    from streamrl.operator.runtime import Runtime

log = logging.getLogger("streamrl.operator")


async def fetch_trainer_status(job: str, namespace: str) -> dict | None:
    """The trainer's /status body through its Service (None while it cannot be reached)."""
    try:
        async with httpx.AsyncClient(timeout=2.0) as http:
            reply = await http.get(f"http://{name(job, 'trainer-admin')}.{namespace}.svc:{ADMIN_PORT}/status")
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


async def _ready_replicas(client, path: str, seen: dict[str, dict]) -> int:
    d = seen.get(path)
    if d is None:
        try:
            d = await client.get(path)
        except (KubeError, httpx.HTTPError):
            return 0
    return int(((d or {}).get("status") or {}).get("readyReplicas") or 0)


FETCHING = {FETCH_CONTAINER: "model and task file (from the Hugging Face Hub)",
            COPY_CONTAINER: "model (copied out of its image)"}
"""The trainer's init containers (sources.py) and what a running one is doing."""
WAITING_PROBLEMS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                    "CreateContainerError", "CrashLoopBackOff", "RunContainerError")
"""A container waiting for one of these reasons will not start by waiting longer."""


def pod_problems(pods: list[dict], events: list[dict], job: str,
                 progress: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(reason, message) of what keeps the job's pods from running, refusals first: pods the
    Job or ReplicaSet controllers could not create (FailedCreate Events: Pod Security admission,
    quota), pods the scheduler cannot place (no node with the GPUs, a claim that does not
    bind, a node selector no node has), containers that cannot start (image pulls, a missing
    Secret, a crash loop), an init container that failed (the model's: its last line says
    why) or still runs (`progress`: by pod, the last line its download wrote). Repeated
    messages are said once."""
    out: list[tuple[str, str]] = []
    for event in events:
        involved = event.get("involvedObject") or {}
        if event.get("reason") == "FailedCreate" and str(involved.get("name", "")).startswith(f"{job}-"):
            out.append(("FailedCreate", f"{involved.get('kind', 'controller')} {involved.get('name')}: "
                                        f"{event.get('message', '')}"))
    for pod in pods:
        pod_name, status = pod["metadata"]["name"], pod.get("status") or {}
        for c in status.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                out.append(("Unschedulable", f"pod {pod_name}: {c.get('message', '')}"))
        for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            waiting = (c.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in WAITING_PROBLEMS:
                out.append((waiting["reason"], f"pod {pod_name} container {c.get('name')}: "
                                               f"{waiting.get('message') or waiting['reason']}"))
        for c in status.get("initContainerStatuses") or []:  # the model's init containers (sources.py)
            state = c.get("state") or {}
            ended = state.get("terminated") or {}
            if ended.get("exitCode", 0) != 0:  # a repository that does not exist, an image without `cp`...
                said = (ended.get("message") or ended.get("reason") or "").strip().splitlines()
                out.append(("InitContainerFailed", f"pod {pod_name} init container {c.get('name')} exited with "
                                                   f"{ended['exitCode']}: {said[-1] if said else 'no message'}"))
            elif "running" in state and c.get("name") in FETCHING:
                said = (progress or {}).get(pod_name, "")
                out.append(("FetchingModel", f"pod {pod_name}: init container {c['name']} is putting the "
                                             f"{FETCHING[c['name']]} in place, since "
                                             f"{state['running'].get('startedAt', 'its start')}"
                                             + (f"; {said}" if said else "")))
    unique: dict[str, tuple[str, str]] = {}
    for reason, message in out:  # the same refusal for every replica reads once
        unique.setdefault(f"{reason}:{message.split(': ', 1)[-1]}", (reason, message))
    return list(unique.values())


async def _pod_problems(runtime: Runtime, job: str, namespace: str) -> tuple[tuple[str, str], ...]:
    try:
        pods = await runtime.kube.list("v1", "Pod", namespace, serialized(selector(job)))
        events = await runtime.kube.list("v1", "Event", namespace, field_selector="reason=FailedCreate")
    except (KubeError, httpx.HTTPError) as err:
        log.warning("RLJob %s/%s: cannot read its pods and Events (%s): a Pending job is not explained", namespace,
                    job, err)
        return ()
    return tuple(pod_problems(pods, events, job, await _download_progress(runtime, namespace, pods)))


async def _download_progress(runtime: Runtime, namespace: str, pods: list[dict]) -> dict[str, str]:
    """By pod, the last line of its running `fetch` init container: how far the model's
    download got (streamrl fetch says its bytes every 10 s)."""
    out: dict[str, str] = {}
    for pod in pods:
        statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
        if not any(c.get("name") == FETCH_CONTAINER and "running" in (c.get("state") or {}) for c in statuses):
            continue
        name = pod["metadata"]["name"]
        try:
            lines = (await runtime.kube.log_tail(namespace, name, FETCH_CONTAINER)).strip().splitlines()
        except (KubeError, httpx.HTTPError) as err:  # an operator without pods/log: progress is not shown
            log.debug("pod %s/%s: cannot read its fetch container's log (%s)", namespace, name, err)
            continue
        if lines:
            out[name] = lines[-1][:300]
    return out


async def observe(runtime: Runtime, job: RLJob, namespace: str, generation: int, cluster_problem: str | None,
                  status: dict | None = None, group: TrainerGroup | None = None, claim_problem: str | None = None,
                  seen: dict[str, dict] | None = None, final: tuple[JobPhase, str] | None = None,
                  refused: tuple[str, str] | None = None) -> Observed:
    """Everything the phase machine needs about one RLJob (`status`: its current status;
    `group`: what was just done to its trainer Job; `claim_problem`: why its checkpoint
    claim cannot be mounted yet; `seen`: children as the apply just found them, by path;
    `final`: the phase the job already ended in; `refused`: the API server's refusal)."""
    j, seen = job.metadata.name, seen or {}
    replicas = job.spec.generators.pool_replicas()
    stopped = job.spec.suspend or final is not None or (group is not None and group.admission.waiting)
    pools = []
    for pool in job.spec.generators.pools:
        client = runtime.clusters.get(pool.cluster_ref) if pool.cluster_ref else runtime.kube
        path = path_of("apps/v1", "Deployment", namespace, name(j, "gen", pool.name))
        ready = await _ready_replicas(client, path, seen if client is runtime.kube else {}) if client else 0
        pools.append({"name": pool.name, "cluster": pool.cluster_ref or "", "replicas":
                      0 if stopped else replicas[pool.name], "readyReplicas": ready})
    if group is not None:  # the Job as ensure_trainer saw it and acted on it
        job_status = group.job_status
    else:
        job_status = ((await runtime.kube.get(path_of("batch/v1", "Job", namespace, name(j, "trainer")))) or {}
                      ).get("status")
    trainer, unreadable = (None, None) if final else await _trainer(runtime, j, namespace)
    ranker = None
    if uses_ranker(job):
        path = path_of("apps/v1", "Deployment", namespace, name(j, "ranker"))
        d = seen.get(path) or await runtime.kube.get(path)
        ranker = {"ready": bool(((d or {}).get("status") or {}).get("readyReplicas"))}
    pods = (int((job_status or {}).get("ready") or 0), 0 if stopped else job.spec.trainer.nodes)
    running = trainer is not None and trainer.phase.value == "Running"
    expected = sum(p["replicas"] for p in pools) + pods[1]
    all_up = pods[0] >= pods[1] and sum(p["readyReplicas"] for p in pools) >= sum(p["replicas"] for p in pools)
    problems = () if final or refused or expected == 0 or (running and all_up) else \
        await _pod_problems(runtime, j, namespace)
    return Observed(generation=generation, suspended=job.spec.suspend, trainer_group=group, trainer_pods=pods,
                    trainer_job=job_status, trainer=trainer, trainer_unreadable=unreadable,
                    pools=pools, cluster_problem=cluster_problem, claim_problem=claim_problem, ranker=ranker,
                    label_selector=generator_selector(j), scaling_limited=_scaling_limited(job, status),
                    final=final, refused=refused, pod_problems=problems)
