"""Making this cluster match an RLJob: parse its body, check the built children against
Kubernetes's own schemas, apply them (server-side apply, skipped for an object unchanged
since the operator last applied it), supervise the trainer group (restarts within the
budget, preemptions free, never re-created once the job is over, `suspend` left to Kueue
or any queue that suspended it), keep the checkpoint claim and prune what the spec no longer asks
for. Pools in other clusters: remote.py. Knows no phase: it returns what it did and what
went wrong."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import replace

import kubernetes_validate

from streamrl.operator.admission import find_workload, needs_workload, read_admission
from streamrl.operator.builders import PREEMPTED_EXIT_CODE, claim_name
from streamrl.operator.fieldowners import LEGACY_MANAGERS, migration_patch
from streamrl.operator.kube import KubeClient, KubeError, path_for, path_of
from streamrl.operator.names import (
    ADOPT_CHECKPOINTS,
    JOB_UID,
    RESTARTS,
    SUSPENDED_BY,
    TEMPLATE_HASH,
    selector,
    serialized,
)
from streamrl.operator.phases import TrainerGroup, rank0_succeeded
from streamrl.operator.runtime import Runtime
from streamrl.operator.settings import Settings
from streamrl.service import ExitCode
from streamrl.spec import API_VERSION, GROUP, KIND, RLJob, SpecError, parse_job

KUBERNETES_VERSION = "1.33"
"""Schemas free-form parts are checked against until the API server said its own version."""
MIN_KUBERNETES = (1, 31)
"""The oldest Kubernetes the trainer's Job works on: its successPolicy (rank 0 alone completes
it) is on by default from 1.31; an older server drops it and waits for every index."""
PRUNED_KINDS = (("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap"),
                ("networking.k8s.io/v1", "NetworkPolicy"))
"""Kinds of children a spec change can make unwanted (listed by the job's label; the claim and
the trainer Job have their own lifecycles; the minted token Secret of a job that came to name
its own tokenFile is left to the garbage collector, with the job: the operator may neither
read nor delete Secrets where jobs live)."""
UNREAD_KINDS = frozenset({"Secret"})
"""Kinds the operator never reads in its own cluster (the chart grants no `get` on them where
jobs live, so that no Secret can be read by name): applied every round without a GET first."""
ADOPTION_LABELS = ("app.kubernetes.io/managed-by", f"{GROUP}/job")
"""The labels an existing object without a controller must carry, with this job's values, to
be taken over by the job (an object of the job orphaned by a `--cascade=orphan` deletion, say)."""

Logger = logging.Logger | logging.LoggerAdapter


def job_of(body) -> RLJob:
    """The RLJob a kopf body holds; SpecError naming each bad field."""
    meta = body["metadata"]
    metadata = {"name": meta["name"], **({"labels": dict(meta["labels"])} if meta.get("labels") else {})}
    return parse_job({"apiVersion": body.get("apiVersion", API_VERSION), "kind": KIND,
                      "metadata": metadata, "spec": dict(body.get("spec") or {})},
                     source=f"rljob/{meta['name']}")


def schema_version(git_version: str) -> str:
    """The Kubernetes version whose schemas the children are checked against: the server's
    (`v1.31.4-gke.1`: 1.31), within the versions kubernetes-validate knows; ValueError when the
    server is older than MIN_KUBERNETES."""
    found = re.match(r"v?(\d+)\.(\d+)", git_version or "")
    if not found:
        return KUBERNETES_VERSION
    version = (int(found[1]), int(found[2]))
    if version < MIN_KUBERNETES:
        raise ValueError(f"the API server is Kubernetes {git_version}: StreamRL needs {MIN_KUBERNETES[0]}."
                         f"{MIN_KUBERNETES[1]} or newer (the trainer's Job successPolicy)")
    known = sorted({tuple(int(x) for x in v.split(".")[:2]) for v in kubernetes_validate.utils.all_versions()})
    chosen = max((v for v in known if v <= version), default=known[-1])
    return f"{chosen[0]}.{chosen[1]}"


def validate(objects: list[dict], version: str = KUBERNETES_VERSION) -> None:
    """Free-form parts (pod templates, tolerations, resources) end up in these objects:
    check them against Kubernetes's own schemas (of the API server's version) before anything
    is applied."""
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            raise SpecError(f"the {obj['kind']} for {obj['metadata']['name']} would be invalid at "
                            f"{err.json_path}: {err.message} (check that role's placement)") from None


def _digest(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


class ForeignObject(RuntimeError):
    """An object the operator would write exists and belongs to something else."""


def foreign(desired: dict, current: dict) -> str | None:
    """Why `current` is not the operator's to overwrite with `desired`, or None: in this
    cluster, another controller's object (its controller owner reference is not the RLJob), or
    one with no controller that does not carry the job's ADOPTION_LABELS (someone's own object
    that merely has the name); in another cluster, one not marked with the same origin (two
    home clusters with the same namespace and job name, or someone's own object)."""
    want, have = desired["metadata"], current["metadata"]
    origin = {k: v for k, v in want.get("labels", {}).items() if k.startswith("streamrl.io/origin-")}
    if origin:
        theirs = {k: v for k, v in (have.get("labels") or {}).items() if k.startswith("streamrl.io/origin-")}
        return None if theirs == origin else (f"it is marked {theirs or 'with no origin'}, not {origin}")
    ours = {o.get("uid") for o in want.get("ownerReferences") or []}
    controllers = [o for o in have.get("ownerReferences") or [] if o.get("controller")]
    if controllers:
        if ours and not {o.get("uid") for o in controllers} & ours:
            c = controllers[0]
            return f"its controller is {c.get('kind')} {c.get('name')}"
        return None
    wanted = {k: (want.get("labels") or {}).get(k) for k in ADOPTION_LABELS}
    if any((have.get("labels") or {}).get(k) != v for k, v in wanted.items()):
        return "it has no controller and not this job's labels " + ", ".join(f"{k}={v}" for k, v in wanted.items())
    return None


WATCHED = {"ConfigMap": ("", "v1", "configmaps"), "Service": ("", "v1", "services"),
           "Deployment": ("apps", "v1", "deployments")}
"""Children whose changes the operator watches, by kind: (group, version, plural) of the
watch (handlers.remember_child)."""
WATCHED_KINDS = frozenset(WATCHED)
"""Children whose changes the operator watches (handlers.remember_child): read from
Runtime.children rather than GET each round. A stale event there costs at most one no-op
apply. (The trainer Job is read each round: a stale event could count a failure twice.)"""
RESYNC_S = 300.0
"""How often each job's children are read from the API server all the same (as an informer
resyncs): a watch that missed an event is repaired within this."""


async def read_child(runtime: Runtime, client: KubeClient, key: str, path: str, kind: str) -> dict | None:
    """A child as the API server holds it: from the watch's cache for this cluster's watched
    kinds (between resyncs of the job `key`), else a GET (which refreshes the cache)."""
    cached = client is runtime.kube and kind in WATCHED_KINDS
    if cached and path in runtime.children and key in runtime.resynced:
        return runtime.children[path]
    current = await client.get(path)
    if cached:
        runtime.children[path] = current
    return current


def _remember(runtime: Runtime, client: KubeClient, path: str, kind: str, obj: dict | None) -> None:
    if client is runtime.kube and kind in WATCHED_KINDS:
        runtime.children[path] = obj


def due_for_resync(runtime: Runtime, key: str, now: float) -> bool:
    """Whether this round reads the job's children from the API server (the first round, then
    every RESYNC_S); it marks the resync as started."""
    if now - runtime.resynced.get(key, -RESYNC_S) >= RESYNC_S:
        runtime.resynced.pop(key, None)
        return True
    return False


async def apply_all(runtime: Runtime, client: KubeClient, key: str, objects: list[dict],
                    logger: Logger) -> dict[str, dict]:
    """Server-side apply each object, unless the operator applied exactly this before and
    the object has not changed since (same resourceVersion): an unchanged child costs no
    write, and no read where a watch keeps it (read_child); a deleted or edited one is
    repaired. Returns each object as the server holds it now, by API path. ForeignObject,
    before anything of it is written, for an object that exists and is not the operator's
    (`foreign`). UNREAD_KINDS in this cluster are applied every round without being read (an
    apply that changes nothing writes nothing), so they are never checked for being someone
    else's."""
    memory = runtime.applied.setdefault(key, {})
    out: dict[str, dict] = {}
    for obj in objects:
        path = path_for(obj)
        unread = client is runtime.kube and obj["kind"] in UNREAD_KINDS
        current = None if unread else await read_child(runtime, client, key, path, obj["kind"])
        digest = _digest(obj)
        if current is not None:
            _refuse_foreign(obj, current, client)
            current = await _take_over_legacy_fields(client, path, obj["kind"], current, logger)
            meta = current["metadata"]
            unchanged = memory.get((client.name, path)) == (digest, meta.get("resourceVersion"))
            if meta.get("deletionTimestamp") or unchanged:
                out[path] = current
                continue
        before = memory.get((client.name, path))
        result = await client.apply(obj)
        memory[(client.name, path)] = (digest, result["metadata"].get("resourceVersion"))
        _remember(runtime, client, path, obj["kind"], result)
        out[path] = result
        if unread:
            if before is None or before[1] != result["metadata"].get("resourceVersion"):
                logger.info("applied %s %s%s", obj["kind"], obj["metadata"]["name"], _where(client))
        elif current is None:
            logger.info("created %s %s%s", obj["kind"], obj["metadata"]["name"], _where(client))
        elif result["metadata"].get("resourceVersion") != current["metadata"].get("resourceVersion"):
            logger.info("updated %s %s%s", obj["kind"], obj["metadata"]["name"], _where(client))
    return out


async def _take_over_legacy_fields(client: KubeClient, path: str, kind: str, current: dict, logger: Logger) -> dict:
    """`current` with the fields an operator before server-side apply wrote handed to this
    one (fieldowners.py), so that the apply that follows prunes what it no longer applies."""
    ops = migration_patch(current)
    if ops is None:
        return current
    result = await client.json_patch(path, ops)
    logger.info("took over the fields an earlier operator wrote on %s %s%s (managedFields of %s)", kind,
                current["metadata"]["name"], _where(client), ", ".join(sorted(LEGACY_MANAGERS)))
    return result


def _where(client: KubeClient | None) -> str:
    return "" if client is None or client.name == "local" else f" in cluster {client.name}"


def _refuse_foreign(desired: dict, current: dict, client: KubeClient | None = None) -> None:
    """ForeignObject when `current`, found where `desired` goes, is not the operator's (`foreign`)."""
    problem = foreign(desired, current)
    if problem:
        raise ForeignObject(f"{desired['kind']} {desired['metadata']['name']}{_where(client)} exists and is not this "
                            f"job's ({problem}): not overwritten; delete or rename it")


async def prune(runtime: Runtime, job: RLJob, namespace: str, desired: list[dict], logger: Logger) -> None:
    """Delete this job's children of PRUNED_KINDS the spec no longer asks for (a removed
    pool, the ranker of a job that stopped ranking, the exposure policy of a trainer no longer
    exposed). Runs when the desired set changes (and once after the operator starts)."""
    key = f"{namespace}/{job.metadata.name}"
    wanted = frozenset(path_for(o) for o in desired)
    if runtime.pruned.get(key) == wanted:
        return
    by_label = serialized({**selector(job.metadata.name), "app.kubernetes.io/managed-by": "streamrl-operator"})
    for api_version, kind in PRUNED_KINDS:
        for obj in await runtime.kube.list(api_version, kind, namespace, by_label):
            path = path_of(api_version, kind, namespace, obj["metadata"]["name"])
            if path not in wanted and await runtime.kube.delete(path):
                logger.info("deleted %s %s: the spec no longer asks for it", kind, obj["metadata"]["name"])
    runtime.pruned[key] = wanted


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
_JOB_ERROR = re.compile(rf"\bexit code {int(ExitCode.JOB_ERROR)}\b")


def job_error(failed: dict) -> bool:
    """Whether a failed trainer Job failed through its own code or files in a way every start
    repeats (its trainer exited ExitCode.JOB_ERROR: a raising reward function, checkpoints of
    another job): not restarted. `failed`: the Job's Failed condition, whose message names the
    exit code of the rule that matched."""
    return failed.get("reason") == "PodFailurePolicy" and bool(_JOB_ERROR.search(failed.get("message") or ""))


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


KUBELET_EVICTION = "TerminationByKubelet"
"""The DisruptionTarget reason of a pod the kubelet evicted (node memory or disk pressure, an
emptyDir over its sizeLimit): not free, since the same pod on the same kind of node does it again."""


async def disruptions(runtime: Runtime, job: RLJob, namespace: str) -> set[str]:
    """The reasons of the DisruptionTarget conditions of the trainer's pods (TerminationByKubelet,
    EvictionByEvictionAPI, PreemptionByScheduler, DeletionByTaintManager...)."""
    pods = await runtime.kube.list("v1", "Pod", namespace, serialized(selector(job.metadata.name, "trainer")))
    return {c.get("reason") or "" for p in pods for c in (p.get("status") or {}).get("conditions") or []
            if c.get("type") == "DisruptionTarget" and c.get("status") == "True"}


async def _no_record(counts: dict) -> None:
    return None


async def ensure_trainer(runtime: Runtime, job: RLJob, desired: dict, restarts: int, budget: int, logger: Logger,
                         preemptions: int = 0, finished: bool = False,
                         record: Callable[[dict], Awaitable[None]] = _no_record) -> TrainerGroup:
    """Make the trainer Job match `desired`, a whole group at a time. A Job cannot change its
    pods once created: a new template (the spec or the config it loads changed) replaces the
    Job and its pods (a new spec is a new attempt: the counts start again from 0); a failed
    Job (any one pod failing fails it) is deleted and created again, every pod at once: free
    when it was stopped from outside (a preemption, see `preemption`), else while `restarts`
    < `budget`. Deletion is in the foreground: the new Job is created once the old one and its
    pods are gone, so no new rank meets an old one at the rendezvous.
    `finished` (the job is Succeeded or Failed): the Job is only read, never created again.
    Who holds the Job's `suspend` is read from the live Job (admission.py), not only from the
    RLJob's label: a Job Kueue labelled or keeps a Workload for is Kueue's (it admits the Job
    and un-suspends it; spec.suspend then means no Job at all), and the operator lifts only a
    suspension it made itself, never Kueue's or another queue's. The group returned says
    whether the Job waits for admission (the reconciler holds the pools and ranker meanwhile).
    The restarts so far are the failed Job's own (its RESTARTS annotation, set at creation);
    `restarts` (the status's) counts only while there is no Job. Before a failed group is
    deleted, the new counts are `record`ed (the status): an operator that dies in between
    finds the same failed Job and counts the same restart again, not one more."""
    path, namespace = path_for(desired), desired["metadata"]["namespace"]
    current = await runtime.kube.get(path)  # never from the watch's cache: a late event must not fail a group twice
    if finished:
        seen = (current or {}).get("status") or {}
        return TrainerGroup("finished", restarts, job_status=seen if current else None, preemptions=preemptions)
    if current is not None and not current["metadata"].get("deletionTimestamp"):
        _refuse_foreign(desired, current)  # someone else's Job of that name is neither replaced nor restarted
    workload = (await find_workload(runtime.kube, namespace, current)
                if current is not None and needs_workload(job, current) else None)
    admission = read_admission(job, namespace, current, workload)
    key = f"{namespace}/{job.metadata.name}"
    if admission.kueue and current is not None:
        runtime.queued.add(key)
    group, created = await _supervise(runtime, job, desired, current, admission.kueue or key in runtime.queued,
                                      restarts, budget, logger, preemptions, record)
    if created is not None:  # as the API server's admission (Kueue's webhook) made it
        admission = read_admission(job, namespace, created, created=True)
    return replace(group, admission=admission)


async def _supervise(runtime: Runtime, job: RLJob, desired: dict, current: dict | None, kueue: bool, restarts: int,
                     budget: int, logger: Logger, preemptions: int,
                     record: Callable[[dict], Awaitable[None]]) -> tuple[TrainerGroup, dict | None]:
    """ensure_trainer's decision on the Job `current` (`kueue`: Kueue owns its suspend); the
    group, and the Job when this round created it."""
    path = path_for(desired)
    seen = (current or {}).get("status") or {}
    if current is None:
        if kueue and job.spec.suspend:
            return TrainerGroup("suspended", restarts, preemptions=preemptions), None
        desired["metadata"]["annotations"][RESTARTS] = str(restarts)
        created = None
        try:
            created = await runtime.kube.create(desired)
        except KubeError as err:
            if err.status != 409:  # 409: a concurrent round created it; the next one reads it
                raise
        logger.info("created the trainer Job %s (group restarts so far: %d)", desired["metadata"]["name"], restarts)
        return TrainerGroup("created", restarts, preemptions=preemptions), created
    if current["metadata"].get("deletionTimestamp"):
        return TrainerGroup("waiting", restarts, "waiting for the previous trainer Job and its pods to be deleted",
                            seen, preemptions), None
    if rank0_succeeded(current.get("status")):
        return TrainerGroup("finished", restarts, job_status=seen, preemptions=preemptions), None
    wanted = desired["metadata"]["annotations"][TEMPLATE_HASH]
    if (current["metadata"].get("annotations") or {}).get(TEMPLATE_HASH) != wanted:
        await runtime.kube.delete(path, propagation="Foreground")
        logger.info("the trainer's pod template or the config it loads changed: replacing the whole trainer group")
        return TrainerGroup("rolling", 0, "replacing the trainer group for the new spec", seen), None
    failed = job_condition(current, "Failed")
    if failed:
        restarts = int((current["metadata"].get("annotations") or {}).get(RESTARTS) or restarts)
        why = failed.get("message") or failed.get("reason") or "a trainer pod failed"
        free = preemption(failed, bool((current.get("spec") or {}).get("suspend")) or job.spec.suspend)
        if free and free.startswith("disrupted") and KUBELET_EVICTION in await disruptions(
                runtime, job, desired["metadata"]["namespace"]):
            free, why = None, (f"a trainer pod was evicted by the kubelet ({KUBELET_EVICTION}: node memory or disk "
                               f"pressure, or a volume over its sizeLimit), which a restart tends to repeat: {why}")
        limit = job.spec.trainer.preemption_limit
        if free and preemptions >= limit:
            free, why = None, (f"{free}, after {preemptions} preemption(s) already (trainer.preemptionLimit "
                               f"{limit}): {why}")
        if free:
            await record({"restarts": restarts, "preemptions": preemptions + 1})
            await runtime.kube.delete(path, propagation="Foreground")
            logger.info("the trainer group was %s (%s): restarting every rank, not counted against the restart "
                        "budget", free, why)
            return TrainerGroup("restarting", restarts, f"restarting the trainer group, {free} (not counted "
                                                        f"against the restart budget): {why}", seen,
                                preemptions + 1), None
        if job_error(failed):
            return TrainerGroup("failed", restarts, f"the trainer failed with exit code {int(ExitCode.JOB_ERROR)}: the "
                                                    "job's own code or files failed in a way every restart repeats "
                                                    f"(see the trainer's log); not restarted: {why}", seen,
                                preemptions), None
        if restarts >= budget:
            return TrainerGroup("failed", restarts, f"the trainer group failed after {restarts} restart(s) "
                                                    f"(budget {budget}): {why}", seen, preemptions), None
        await record({"restarts": restarts + 1, "preemptions": preemptions})
        await runtime.kube.delete(path, propagation="Foreground")
        logger.warning("the trainer group failed (%s): restarting every rank (restart %d of %d)", why,
                       restarts + 1, budget)
        return TrainerGroup("restarting", restarts + 1,
                            f"restarting the trainer group (restart {restarts + 1} of {budget}): {why}", seen,
                            preemptions), None
    unchanged = TrainerGroup("unchanged", restarts, job_status=seen, preemptions=preemptions)
    if kueue:
        if job.spec.suspend:  # Kueue owns `suspend`: a suspended job has no Job at all
            await runtime.kube.delete(path, propagation="Foreground")
            logger.info("spec.suspend: deleting the trainer Job (Kueue owns its suspend); it is created again, "
                        "for Kueue to admit, when the job resumes")
            return TrainerGroup("suspended", restarts, job_status=seen, preemptions=preemptions), None
        return unchanged, None
    suspended = bool((current.get("spec") or {}).get("suspend"))
    if suspended == job.spec.suspend:
        return unchanged, None
    if suspended and not (current["metadata"].get("annotations") or {}).get(SUSPENDED_BY):
        return unchanged, None  # another controller (a queue) suspended it: not the operator's to lift
    await runtime.kube.patch(path, {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"],
                                                 "annotations": {SUSPENDED_BY: "spec.suspend" if job.spec.suspend
                                                                 else None}},
                                    "spec": {"suspend": job.spec.suspend}})
    logger.info("trainer Job %s", "suspended" if job.spec.suspend else "resumed")
    return TrainerGroup("updated", restarts, job_status=seen, preemptions=preemptions), None


def claim_of_another_job(current: dict, desired: dict, adopt: bool) -> str | None:
    """Why a claim the operator made cannot be this job's, or None: it was made for another
    RLJob of the same name (a retained claim outlives its job) and holds that job's checkpoints,
    which this job would resume from unawares, or refuse as another job's and fail. `adopt`:
    the user asked to resume from them (ADOPT_CHECKPOINTS on the RLJob)."""
    theirs = (current["metadata"].get("annotations") or {}).get(JOB_UID)
    ours = (desired["metadata"].get("annotations") or {}).get(JOB_UID)
    if theirs is None or ours is None or theirs == ours or adopt:
        return None
    claim = current["metadata"]["name"]
    return (f"PersistentVolumeClaim {claim} holds the checkpoints of an earlier RLJob of this name (uid {theirs}), "
            f"not this one's: not used. Delete the claim to start afresh, or annotate this RLJob "
            f"{ADOPT_CHECKPOINTS}=true to resume from them")


async def _create_claim(runtime: Runtime, desired: dict, what: str, logger: Logger) -> None:
    """Create a claim the operator makes (one created meanwhile, 409, is as good)."""
    try:
        await runtime.kube.create(desired)
    except KubeError as err:
        if err.status != 409:
            raise
    spec = desired["spec"]
    logger.info("created the %s claim %s (%s, %s)", what, desired["metadata"]["name"],
                spec["resources"]["requests"]["storage"], spec["accessModes"][0])


async def ensure_cache_claim(runtime: Runtime, desired: dict | None, logger: Logger) -> str | None:
    """The hub cache's claim (builders.build_hub_cache_claim): created once, its spec the
    cluster's afterwards (a bound claim's size and mode are not the operator's to change); one
    of that name that is not the job's is ForeignObject. Returns why the trainer's pods cannot
    mount it yet (None: they can, or the job has none)."""
    if desired is None:
        return None
    claim = desired["metadata"]["name"]
    path = path_of("v1", "PersistentVolumeClaim", desired["metadata"]["namespace"], claim)
    current = await runtime.kube.get(path)
    if current is None:
        await _create_claim(runtime, desired, "hub cache", logger)
        return None
    if current["metadata"].get("deletionTimestamp"):
        return f"waiting for the previous PersistentVolumeClaim {claim} to be deleted (the hub cache, model.hf)"
    _refuse_foreign(desired, current)
    return None


async def ensure_claim(runtime: Runtime, job: RLJob, namespace: str, desired: dict | None, owner: dict | None,
                       logger: Logger, adopt: bool = False) -> str | None:
    """The checkpoint claim: created once when the operator makes it (`desired`; its spec is
    the cluster's afterwards: a bound claim's size and mode are not the operator's to change),
    its owner reference following `retain`; an existing claim (claimName) only looked for.
    A claim made for an earlier RLJob of the same name is ForeignObject unless `adopt`; one
    made before claims were marked (no JOB_UID) is marked as this job's.
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
        await _create_claim(runtime, desired, "checkpoint", logger)
        return None
    _refuse_foreign(desired, current)  # a claim of that name that is someone else's is neither adopted nor deleted
    problem = claim_of_another_job(current, desired, adopt)
    if problem:
        raise ForeignObject(problem)
    mark = (desired["metadata"].get("annotations") or {}).get(JOB_UID)
    if mark is not None and (current["metadata"].get("annotations") or {}).get(JOB_UID) != mark:
        await runtime.kube.patch(path, {"metadata": {"annotations": {JOB_UID: mark}}})
        logger.info("checkpoint claim %s: marked as this job's (uid %s)%s", claim, mark,
                    ", adopting the checkpoints of the earlier job" if adopt else "")
    owners = desired["metadata"].get("ownerReferences")
    ours = [o for o in current["metadata"].get("ownerReferences") or [] if owner and o.get("uid") == owner["uid"]]
    if bool(owners) != bool(ours):  # retain changed: the garbage collector keeps it, or takes it with the job
        await runtime.kube.patch(path, {"metadata": {"ownerReferences": owners}})
        logger.info("checkpoint claim %s: %s", claim, "deleted with the job" if owners else "kept after the job")
    return None  # a claim not bound yet shows in its pods' scheduling (observe.pod_problems)
