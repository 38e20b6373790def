"""Who holds the trainer Job's `suspend`, read from the live Job and Kueue's Workload for it:
the operator (spec.suspend), Kueue (the queue-name label on the Job, put there by the
RLJob or by Kueue's LocalQueue defaulting, or a Workload for it, as under
manageJobsWithoutQueueName) or another queue; and, while the group waits for admission, why
(the Workload's conditions). Knows nothing of the other children: the reconciler holds them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TypeGuard

from streamrl.operator.builders import queue_name
from streamrl.operator.kube import KubeClient, KubeError
from streamrl.operator.names import QUEUE_NAME, SUSPENDED_BY
from streamrl.spec import RLJob

log = logging.getLogger("streamrl.operator")

WORKLOAD_API = "kueue.x-k8s.io/v1beta2"
"""Kueue's Workload API (v1beta2 is the version it stores from v0.15; v1beta1 is deprecated)."""
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
"""spec.managedBy Kueue's webhook gives a Job whose ClusterQueue dispatches through MultiKueue."""
JOB_UID = "kueue.x-k8s.io/job-uid"
"""The label Kueue's job controller puts on a Job's Workload: the Job's uid."""
WAITING = {"Pending": "waiting for quota", "WaitingForQuota": "waiting for quota",
           "PendingEvaluation": "waiting for quota", "WaitingForPreemptedWorkloads": "waiting for quota",
           "WaitingForPodsReady": "waiting for quota", "NoMatchingFlavor": "inadmissible",
           "ExceedsMaxQuota": "inadmissible", "Inadmissible": "inadmissible", "Misconfigured": "inadmissible",
           "Suspended": "its queue is stopped", "UnsatisfiedAdmissionChecks": "waiting for admission checks",
           "UnsatisfiedChecks": "waiting for admission checks"}
"""What a Workload's QuotaReserved or Admitted reason means for the job (Kueue's
apis/kueue/v1beta2/workload_types.go; "Pending" before v0.19's UnadmittedWorkloadsObservability)."""


@dataclass(frozen=True)
class Admission:
    """The trainer Job's admission as one round saw it."""

    kueue: bool = False
    """Kueue owns the Job's `suspend` (the operator never sets it; spec.suspend deletes the Job)."""
    waiting: bool = False
    """The group waits for admission (queued, preempted, evicted, or suspended by another
    controller): the generator pools and the ranker are held at 0 replicas meanwhile."""
    reason: str = "NotQueued"
    """CamelCase: NotQueued, Admitted, the Workload's reason (Pending, Inadmissible, Evicted...),
    NoWorkload (none yet: Kueue not running, or not for Jobs), SuspendedByOther."""
    message: str = ""


def _condition(workload: dict | None, kind: str) -> dict | None:
    return next((c for c in ((workload or {}).get("status") or {}).get("conditions") or []
                 if c.get("type") == kind), None)


def _true(condition: dict | None) -> TypeGuard[dict]:
    return bool(condition) and condition.get("status") == "True"


def read_admission(job: RLJob, namespace: str, live: dict | None, workload: dict | None = None,
                   created: bool = False) -> Admission:
    """The admission of the trainer Job `live` (None: not created yet; `created`: just created,
    before Kueue could make its Workload) with its Workload."""
    queue = ((live or {}).get("metadata", {}).get("labels") or {}).get(QUEUE_NAME) if live else queue_name(job)
    kueue = queue is not None or workload is not None
    named = queue or ((workload or {}).get("spec") or {}).get("queueName")
    where = f"queued in LocalQueue {namespace}/{named}" if named else "queued by Kueue"
    creating = Admission(kueue, kueue, "Pending" if kueue else "NotQueued",
                         f"{where}: the trainer Job is being created for Kueue to admit" if kueue else "")
    if live is None:
        return creating
    spec, annotations = live.get("spec") or {}, live["metadata"].get("annotations") or {}
    if spec.get("managedBy") == MULTIKUEUE:
        return Admission(True, True, "MultiKueue", f"{where}: dispatched by MultiKueue to another cluster, which "
                                                   "StreamRL does not support (its generators, ranker and Services "
                                                   "stay here and cannot reach it): use a LocalQueue without "
                                                   "MultiKueue, and RLClusters for pools elsewhere")
    if not spec.get("suspend"):
        return Admission(kueue, False, "Admitted" if kueue else "NotQueued",
                         "the trainer Job was admitted by Kueue" if kueue else "")
    if not kueue and annotations.get(SUSPENDED_BY):
        return Admission()  # the operator's own suspension (spec.suspend)
    if workload is None:
        if kueue and created:
            return creating
        if kueue:
            return Admission(True, True, "NoWorkload", f"{where}: waiting for Kueue to admit the trainer Job (it has "
                                                       "no Workload yet: is Kueue running, for batch/Job?)")
        return Admission(False, True, "SuspendedByOther", "the trainer Job was suspended by another controller "
                                                          "(a queue?): waiting for it to be resumed")
    evicted, admitted = _condition(workload, "Evicted"), _condition(workload, "Admitted")
    reserved = _condition(workload, "QuotaReserved")
    if _true(evicted):
        return Admission(True, True, "Evicted", f"{where}: evicted ({evicted.get('reason', '')}: "
                                                f"{evicted.get('message', '')}), waiting to be admitted again")
    if _true(admitted):  # Kueue is un-suspending it: the other roles may start with it
        return Admission(True, False, "Admitted", f"{where}: admitted, the trainer Job is being started")
    why = admitted if _true(reserved) else reserved
    reason = (why or {}).get("reason") or "Pending"
    said = (why or {}).get("message")
    return Admission(True, True, reason, f"{where}: {WAITING.get(reason, 'waiting for admission')}"
                                         + (f" ({said})" if said else ""))


def needs_workload(job: RLJob, live: dict | None) -> bool:
    """Whether the round must look for the Job's Workload: to say why a suspended Job waits,
    or before the operator suspends a Job someone else may queue."""
    if live is None:
        return False
    suspended = bool((live.get("spec") or {}).get("suspend"))
    ours = bool((live["metadata"].get("annotations") or {}).get(SUSPENDED_BY))
    return (suspended and not ours) or (job.spec.suspend and not suspended)


async def find_workload(kube: KubeClient, namespace: str, live: dict) -> dict | None:
    """The Workload Kueue keeps for the Job `live` (controller-owned by it), or None: none, no
    Kueue installed (its API is not served) or not allowed to read Workloads."""
    uid = live["metadata"].get("uid")
    try:
        items = await kube.list(WORKLOAD_API, "Workload", namespace, f"{JOB_UID}={uid}")
    except KubeError as err:
        if err.status != 403:
            raise
        log.warning("cannot read Kueue's Workloads in %s (%s): the trainer Job's admission is not explained",
                    namespace, err.message)
        return None
    return next((w for w in items if any(o.get("uid") == uid and o.get("controller")
                                         for o in w["metadata"].get("ownerReferences") or [])), None)
