"""The kopf handlers, thin: parse, call, write status. All I/O goes through the Runtime in
kopf's memo, so tests run the real handlers against an emulated API server. `register`
puts them on a registry with the settings' intervals; importing this module registers
nothing and reads no environment.

RLJob: one reconcile (`reconcile_rljob`), run on create, resume and spec change and again by
a timer every status interval, under a per-job lock so the two never interleave: apply every
child here and in other clusters (drift repaired, removed keys gone, nothing written when
nothing changed), supervise the trainer group, prune, keep `spec.generators.replicas` (the
/scale field) set, observe, write the status (only what changed) and post a Resumed Event
when the trainer reports a start resumed from a checkpoint. A job that ended (Succeeded,
Failed) keeps no GPU and never trains again; a job whose trainer Job waits for admission
(Kueue's, or another queue's) holds its pools and ranker at 0, applied after the trainer Job
so its first round already knows; the API server's refusals become phase Invalid
with its message. A daemon per RLJob runs the autoscaler (autoscaler.py). Deletion: children
in other clusters are removed through a finalizer (owner references cannot cross clusters).
RLCluster: checked and probed (clusters.py) on change and on a timer; the result is its status.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import time

import httpx
import kopf

from streamrl.operator import clusters, reconcile, remote
from streamrl.operator.autoscaler import autoscale
from streamrl.operator.builders import build_children, claim_name, hub_cache_claim_name
from streamrl.operator.kube import KubeError, path_of
from streamrl.operator.names import ADOPT_CHECKPOINTS, owner_reference
from streamrl.operator.observe import observe
from streamrl.operator.perimeter import job_token, token_key
from streamrl.operator.phases import JobPhase, Observed, derive, resumed_event, status_changes
from streamrl.operator.pods import minted_token
from streamrl.operator.runtime import Runtime
from streamrl.operator.scaling import REPLICAS_FROM_POOLS
from streamrl.operator.settings import Settings
from streamrl.spec import API_VERSION, GROUP, KIND, VERSION, RLJob, SpecError

RLJOBS, RLCLUSTERS = (GROUP, VERSION, "rljobs"), (GROUP, VERSION, "rlclusters")
GROUP_EVENTS = {"restarting": ("Warning", "GroupRestarted"), "rolling": ("Normal", "GroupReplaced")}
"""Events on the RLJob for what is done to its trainer group (a restart after a preemption: Preempted)."""
FINISHED_RESYNC_S = 600.0
"""How often the timer looks at a finished job again (its pools and ranker at zero, nothing to supervise)."""
CLUSTER_PROBE_INTERVAL_S = 60.0
"""How often a registered RLCluster is probed again (reachable, and allowed what the operator does there)."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def remember_child(type, body, memo, **_):  # noqa: A002 (kopf's name for the event type)
    """A watched child changed (or was listed): what reconcile.read_child returns for it."""
    meta = body["metadata"]
    path = path_of(body["apiVersion"], body["kind"], meta.get("namespace"), meta["name"])
    memo.runtime.children[path] = None if type == "DELETED" else copy.deepcopy(dict(body))


async def reconcile_rljob(meta, namespace, memo, logger, status=None, **kwargs):
    """One round, on the RLJob as the API server holds it now (not kopf's snapshot, which a
    round waiting for the lock may have outlived); its status is written before the lock is
    released, so the next round reads what this one decided. A finished job's timer rounds
    run only every FINISHED_RESYNC_S: its children are at zero and stay so."""
    runtime: Runtime = memo.runtime
    key = f"{namespace}/{meta['name']}"
    now = time.monotonic()
    if kwargs.get("reason") is None and _final(status or {}) is not None:  # the timer (not a change)
        if now - runtime.settled.get(key, -FINISHED_RESYNC_S) < FINISHED_RESYNC_S:
            return
        runtime.settled[key] = now
    reconcile.due_for_resync(runtime, key, now)
    path = path_of(API_VERSION, KIND, namespace, meta["name"])
    async with runtime.lock(key):
        body = await runtime.kube.get(path)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        status = body.get("status") or {}

        async def record(counts: dict) -> None:  # what must outlive a crash before the round's end
            await runtime.kube.patch(f"{path}/status", {"status": {"trainer": counts}})

        new = await _reconcile(runtime, body, namespace, status, logger, record)
        diff = status_changes(status, new)
        if diff:
            await runtime.kube.patch(f"{path}/status", {"status": diff})


def _final(status: dict) -> tuple[JobPhase, str] | None:
    """The phase the job ended in, when it did (Succeeded, Failed: for good)."""
    phase = JobPhase.of(status.get("phase"))
    return (phase, status.get("message") or "") if phase is not None and phase.is_final else None


async def _token(runtime: Runtime, body, namespace: str, job: RLJob) -> str | None:
    if not minted_token(job):
        return None
    if runtime.token_key is None:
        runtime.token_key = await token_key(runtime.kube, runtime.settings)
    return job_token(runtime.token_key, runtime.cluster_id, namespace, job.metadata.name, body["metadata"]["uid"])


async def _reconcile(runtime: Runtime, body, namespace: str, status: dict, logger, record) -> dict:
    """One round for one RLJob; returns the status it should have."""
    generation = int(body["metadata"].get("generation") or 1)
    previous, final = status.get("conditions"), _final(status)
    owner = owner_reference(body)
    key = f"{namespace}/{body['metadata']['name']}"
    try:
        job = reconcile.job_of(body)
        token = await _token(runtime, body, namespace, job)
        children = build_children(job, namespace, runtime.settings, owner, token, finished=final is not None,
                                  held=False)
        reconcile.validate(children, runtime.kubernetes_version)
    except SpecError as err:
        if JobPhase.of(status.get("phase")) != JobPhase.INVALID or status.get("message") != str(err):
            logger.warning("invalid RLJob: %s", err)
        return derive(Observed(generation=generation, invalid=str(err)), previous, _now())
    trainer = next(c for c in children if c["kind"] == "Job")
    claims = {c["metadata"]["name"]: c for c in children if c["kind"] == "PersistentVolumeClaim"}
    claim, hub_cache = claims.get(claim_name(job) or ""), claims.get(hub_cache_claim_name(job) or "")
    problem, refused, group, claim_problem, seen = None, None, None, None, {}
    try:
        if final is None:
            await _keep_scale_total(runtime, body, job, namespace, logger)
        seen = await reconcile.apply_all(runtime, runtime.kube, key, [c for c in children if c["kind"] not in
                                                                      ("Job", "PersistentVolumeClaim", "Deployment")],
                                         logger)
        adopt = (body["metadata"].get("annotations") or {}).get(ADOPT_CHECKPOINTS) == "true"
        claim_problem = (await reconcile.ensure_claim(runtime, job, namespace, claim, owner, logger, adopt)
                         or await reconcile.ensure_cache_claim(runtime, hub_cache, logger))
        group = await reconcile.ensure_trainer(runtime, job, trainer, _count(status, "restarts"),
                                               reconcile.restart_budget(job, runtime.settings), logger,
                                               _count(status, "preemptions"), finished=final is not None,
                                               record=record)
        # The pools and ranker after the trainer Job: held at 0 while it waits for admission,
        # as the API server's admission (Kueue's webhook) left it.
        held = group.admission.waiting
        deployments = [c for c in children if c["kind"] == "Deployment"]
        if held:
            deployments = [c for c in build_children(job, namespace, runtime.settings, owner, token, held=True)
                           if c["kind"] == "Deployment"]
        seen |= await reconcile.apply_all(runtime, runtime.kube, key, deployments, logger)
        runtime.resynced.setdefault(key, time.monotonic())  # a round that read them all: the cache holds
        await reconcile.prune(runtime, job, namespace, children, logger)
        problem = await remote.apply_remote(runtime, job, namespace, token, logger, finished=final is not None,
                                            held=held)
    except KubeError as err:
        if not err.refused:
            raise  # a conflict, throttling or the server's own trouble: kopf retries
        refused = (err.reason or f"HTTP{err.status}", f"the API server refused an object of the job: {err.message}")
        if status.get("message", "").find(err.message) < 0:
            logger.error("the API server refused an object of the job: %s", err)
    except reconcile.ForeignObject as err:
        refused = ("AlreadyExists", str(err))
        if status.get("message", "").find(str(err)) < 0:
            logger.error("%s", err)
    if group is not None and group.action in GROUP_EVENTS:
        kind, reason = GROUP_EVENTS[group.action] if group.preemptions == _count(status, "preemptions") else \
            ("Normal", "Preempted")
        kopf.event(body, type=kind, reason=reason, message=group.message)
    observed = await observe(runtime, job, namespace, generation, problem, status, group, claim_problem,
                             seen=seen, final=final, refused=refused)
    _announce_resume(runtime, body, namespace, status, observed)
    new = derive(observed, previous, _now())
    if new["phase"] != status.get("phase") and JobPhase(new["phase"]).is_final:
        kopf.event(body, type="Normal" if new["phase"] == "Succeeded" else "Warning", reason=new["phase"],
                   message=new["message"])
    return new


async def _keep_scale_total(runtime: Runtime, body, job: RLJob, namespace: str, logger) -> None:
    """Keep spec.generators.replicas, the field the /scale subresource reads (HPA, KEDA and
    `kubectl get --subresource=scale` fail while it does not exist), set: the sum of the pools'
    replicas, followed when the pools change, until something else (/scale) writes another
    total, which then spreads over the pools in proportion. The annotation REPLICAS_FROM_POOLS
    remembers the total the pools gave."""
    pools = sum(p.replicas for p in job.spec.generators.pools)
    total = job.spec.generators.replicas
    derived = (body["metadata"].get("annotations") or {}).get(REPLICAS_FROM_POOLS)
    if total is not None and (derived is None or str(total) != derived or str(pools) == derived):
        return  # written by /scale (or the autoscaler) or already the pools' sum
    path = path_of(API_VERSION, KIND, namespace, body["metadata"]["name"])
    try:
        await runtime.kube.patch(path, {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"],
                                                     "annotations": {REPLICAS_FROM_POOLS: str(pools)}},
                                        "spec": {"generators": {"replicas": pools}}})
    except KubeError as err:
        if err.status != 409:
            raise
        return  # the spec changed meanwhile: the next round decides again
    logger.info("spec.generators.replicas set to %d, the pools' sum (the field /scale reads and writes)", pools)


def _count(status, key: str) -> int:
    """A count status.trainer records (restarts, preemptions): 0 before any."""
    return int(((status or {}).get("trainer") or {}).get(key) or 0)


def _announce_resume(runtime: Runtime, body, namespace: str, status, observed: Observed) -> None:
    """A Resumed Event once per trainer start that resumed from a checkpoint: the last start
    announced is remembered in the memo and, across operator restarts, in status.trainer."""
    key = f"{namespace}/{body['metadata']['name']}"
    recorded = ((status or {}).get("trainer") or {}).get("incarnation")
    seen = max(runtime.resumed.get(key, -1), -1 if recorded is None else int(recorded))
    message = resumed_event(observed.trainer, seen)
    if message is None or observed.trainer is None:  # (a message only from a trainer's status)
        return
    runtime.resumed[key] = observed.trainer.incarnation
    kopf.event(body, type="Normal", reason="Resumed", message=message)


STOP_POLL_S = 0.25


async def _sleep_unless_stopped(stopped, delay: float) -> None:
    """Sleep `delay` seconds, returning within STOP_POLL_S of the daemon's stopper being set.
    Not `await stopped.wait(delay)`: that spawns a task per call which, when the daemon is
    cancelled instead (a daemon spawned while the operator exits is never signalled), ends
    later in a TimeoutError that kopf re-raises from its exit."""
    loop = asyncio.get_running_loop()
    until = loop.time() + delay
    while not stopped and loop.time() < until:
        await asyncio.sleep(min(STOP_POLL_S, max(0.0, until - loop.time())))


async def autoscale_rljob(name, namespace, memo, logger, stopped, **_):
    """Every spec.autoscaling.intervalSeconds, one autoscaler round (it does nothing unless
    mode is Internal, and says so in status.autoscaling when External)."""
    runtime: Runtime = memo.runtime
    retry_s = runtime.settings.status_interval_s
    try:
        while not stopped:
            try:
                delay = await autoscale(runtime, namespace, name, logger)
            except (KubeError, httpx.HTTPError) as err:
                logger.warning("autoscaler: the API server failed: %s; next try in %.0fs", err, retry_s)
                delay = retry_s
            await _sleep_unless_stopped(stopped, delay)
    finally:  # the job is gone (or the operator stops): forget what was kept for it
        runtime.forget(f"{namespace}/{name}")


def _has_remote_pools(spec, **_) -> bool:
    return remote.has_remote_pools(spec)


async def delete_remote_children(body, namespace, memo, logger, **_):
    """Owner references cannot cross clusters: remove what this job made elsewhere."""
    runtime: Runtime = memo.runtime
    problem = await remote.remove_remote(runtime, body, namespace, logger)
    if problem:
        raise kopf.TemporaryError(problem, delay=runtime.retry_delay_s)


async def register_cluster(body, spec, status, patch, memo, logger, **_):
    runtime: Runtime = memo.runtime
    cluster = body["metadata"]["name"]
    result = await clusters.register(runtime, cluster, spec)
    new = result.status(_now(), status or {})
    diff = status_changes(status or {}, new)
    if diff:
        patch.status.update(diff)
    if result.problems and (status or {}).get("message") != new["message"]:
        logger.warning("RLCluster %s inactive: %s", cluster, "; ".join(result.problems))


async def forget_cluster(body, memo, **_):
    await clusters.forget(memo.runtime, body["metadata"]["name"])


def register(registry: kopf.OperatorRegistry, settings: Settings,
             cluster_probe_s: float = CLUSTER_PROBE_INTERVAL_S) -> kopf.OperatorRegistry:
    """Put every handler on `registry`, the reconcile timer at the settings' interval."""
    interval = settings.status_interval_s  # also the retry delay after a failure (kopf's default: 60 s)
    kopf.on.update(*RLJOBS, field="spec", backoff=interval, registry=registry)(reconcile_rljob)
    for on in (kopf.on.create, kopf.on.resume):
        on(*RLJOBS, backoff=interval, registry=registry)(reconcile_rljob)
    kopf.timer(*RLJOBS, id="refresh", interval=interval, initial_delay=interval / 2, backoff=interval,
               registry=registry)(reconcile_rljob)
    kopf.daemon(*RLJOBS, cancellation_backoff=2.0, cancellation_timeout=5.0, registry=registry)(autoscale_rljob)
    for resource in reconcile.WATCHED.values():
        kopf.on.event(*resource, labels={"app.kubernetes.io/managed-by": "streamrl-operator"},
                      registry=registry)(remember_child)
    kopf.on.delete(*RLJOBS, when=_has_remote_pools, registry=registry)(delete_remote_children)
    kopf.on.update(*RLCLUSTERS, field="spec", registry=registry)(register_cluster)
    for on in (kopf.on.create, kopf.on.resume):
        on(*RLCLUSTERS, registry=registry)(register_cluster)
    kopf.timer(*RLCLUSTERS, id="probe", interval=cluster_probe_s, initial_delay=cluster_probe_s,
               registry=registry)(register_cluster)
    kopf.on.delete(*RLCLUSTERS, optional=True, registry=registry)(forget_cluster)
    return registry
