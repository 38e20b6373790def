"""The kopf handlers, thin: parse, call, write status. All I/O goes through the Runtime in
kopf's memo, so tests run the real handlers against an emulated API server. `register`
puts them on a registry with the settings' intervals; importing this module registers
nothing and reads no environment.

RLJob: create/resume/spec change -> apply every child (reconcile.py), write the status
(observe.py, phases.py) and post a Resumed Event when the trainer reports a start resumed
from a checkpoint. A timer refreshes the status and supervises the trainer group. A daemon per RLJob runs the
autoscaler (autoscaler.py) every spec.autoscaling.intervalSeconds. Deletion: children in
other clusters are removed through a finalizer (owner references cannot cross clusters).
RLCluster: checked and probed (clusters.py); the result is its status.
"""

from __future__ import annotations

import datetime

import httpx
import kopf

from streamrl.operator import clusters, reconcile
from streamrl.operator.autoscaler import autoscale
from streamrl.operator.builders import build_checkpoint_claim, build_children, build_trainer, owner_reference
from streamrl.operator.kube import KubeError
from streamrl.operator.observe import observe
from streamrl.operator.phases import JobPhase, Observed, derive, resumed_event
from streamrl.operator.runtime import Runtime
from streamrl.operator.settings import Settings
from streamrl.spec import GROUP, VERSION, SpecError

RLJOBS, RLCLUSTERS = (GROUP, VERSION, "rljobs"), (GROUP, VERSION, "rlclusters")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def reconcile_rljob(body, meta, namespace, status, patch, memo, logger, **_):
    runtime: Runtime = memo.runtime
    generation = int(meta.get("generation") or 1)
    previous = (status or {}).get("conditions")
    owner = owner_reference(body)
    try:
        job = reconcile.job_of(body)
        children = build_children(job, namespace, runtime.settings, owner)
        reconcile.validate(children)
    except SpecError as err:
        logger.warning("invalid RLJob: %s", err)
        patch.status.update(derive(Observed(generation=generation, invalid=str(err)), previous, _now()))
        return  # not retried: a new spec brings a new attempt
    trainer = next(c for c in children if c["kind"] == "Job")
    claim = next((c for c in children if c["kind"] == "PersistentVolumeClaim"), None)
    await reconcile.apply(runtime, [c for c in children if c is not trainer and c is not claim], logger)
    claim_problem = await reconcile.ensure_claim(runtime, job, namespace, claim, owner, logger)
    group = await reconcile.ensure_trainer(runtime, trainer, _count(status, "restarts"),
                                           reconcile.restart_budget(job, runtime.settings), logger,
                                           _count(status, "preemptions"))
    await reconcile.prune(runtime, job, namespace)
    problem = await reconcile.apply_remote(runtime, job, namespace)
    observed = await observe(runtime, job, namespace, generation, problem, status, group, claim_problem)
    _announce_resume(runtime, body, namespace, status, observed)
    patch.status.update(derive(observed, previous, _now()))
    if problem:
        raise kopf.TemporaryError(problem, delay=runtime.retry_delay_s)


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
    if message is None:
        return
    runtime.resumed[key] = observed.trainer.incarnation
    kopf.event(body, type="Normal", reason="Resumed", message=message)


async def refresh_rljob_status(body, meta, namespace, status, patch, memo, logger, **_):
    """The status from the children and the trainer; and the trainer group's supervision: a
    failed group is restarted whole (within the budget), a replaced one created again."""
    runtime: Runtime = memo.runtime
    generation = int(meta.get("generation") or 1)
    status = status or {}
    if JobPhase.of(status.get("phase")) == JobPhase.INVALID or status.get("observedGeneration") != generation:
        return  # the spec handler has not applied this generation yet (it writes the status then)
    try:
        job = reconcile.job_of(body)
    except SpecError:
        return
    conditions = status.get("conditions") or []
    # The cluster problem is the spec handler's finding (it retries until it clears); keep it.
    problem = next((c.get("message") or None for c in conditions
                    if c["type"] == "ClustersReady" and c["status"] == "False"), None)
    owner = owner_reference(body)
    claim = build_checkpoint_claim(job, namespace, owner)
    claim_problem = await reconcile.ensure_claim(runtime, job, namespace, claim, owner, logger)
    trainer = build_trainer(job, namespace, runtime.settings, owner)
    group = await reconcile.ensure_trainer(runtime, trainer, _count(status, "restarts"),
                                           reconcile.restart_budget(job, runtime.settings), logger,
                                           _count(status, "preemptions"))
    observed = await observe(runtime, job, namespace, generation, problem, status, group, claim_problem)
    _announce_resume(runtime, body, namespace, status, observed)
    patch.status.update(derive(observed, conditions, _now()))


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
            await stopped.wait(delay)
    finally:  # the job is gone (or the operator stops): forget what was kept for it
        runtime.scaling.pop(f"{namespace}/{name}", None)
        runtime.unreadable.pop(f"{namespace}/{name}", None)
        runtime.resumed.pop(f"{namespace}/{name}", None)


def _has_remote_pools(spec, **_) -> bool:
    return reconcile.has_remote_pools(spec)


async def delete_remote_children(body, namespace, memo, logger, **_):
    """Owner references cannot cross clusters: remove what this job made elsewhere."""
    runtime: Runtime = memo.runtime
    problem = await reconcile.remove_remote(runtime, body["metadata"]["name"], namespace, body["spec"], logger)
    if problem:
        raise kopf.TemporaryError(problem, delay=runtime.retry_delay_s)


async def register_cluster(body, spec, patch, memo, logger, **_):
    runtime: Runtime = memo.runtime
    cluster = body["metadata"]["name"]
    result = await clusters.register(runtime, cluster, spec)
    patch.status.update(result.status(_now()))
    if result.problems:
        logger.warning("RLCluster %s inactive: %s", cluster, "; ".join(result.problems))


async def forget_cluster(body, memo, **_):
    client = memo.runtime.clusters.pop(body["metadata"]["name"], None)
    if client is not None:
        await client.close()


def register(registry: kopf.OperatorRegistry, settings: Settings) -> kopf.OperatorRegistry:
    """Put every handler on `registry`, the status timer at the settings' interval."""
    kopf.on.update(*RLJOBS, field="spec", registry=registry)(reconcile_rljob)
    for on in (kopf.on.create, kopf.on.resume):
        on(*RLJOBS, registry=registry)(reconcile_rljob)
    interval = settings.status_interval_s
    kopf.timer(*RLJOBS, interval=interval, initial_delay=interval / 2, registry=registry)(refresh_rljob_status)
    kopf.daemon(*RLJOBS, cancellation_backoff=2.0, cancellation_timeout=5.0, registry=registry)(autoscale_rljob)
    kopf.on.delete(*RLJOBS, when=_has_remote_pools, registry=registry)(delete_remote_children)
    kopf.on.update(*RLCLUSTERS, field="spec", registry=registry)(register_cluster)
    for on in (kopf.on.create, kopf.on.resume):
        on(*RLCLUSTERS, registry=registry)(register_cluster)
    kopf.on.delete(*RLCLUSTERS, optional=True, registry=registry)(forget_cluster)
    return registry
