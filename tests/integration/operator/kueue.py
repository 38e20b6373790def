"""Kueue in the emulator, as far as the operator meets it: the batch/Job webhook, the Workload
its job controller keeps for a Job, and the scheduler's verdicts as steps a test takes
(`admit`, `evict`). A controller of the Emulator (emulator.py): `mutate` runs on a create
before it is stored, `written` after each create or patch; its own writes go straight to
the store, as a controller's do, without calling back into it.

Kueue v0.19 (API kueue.x-k8s.io/v1beta2, the version it stores; v1beta1 is deprecated), in
kubernetes-sigs/kueue:

| Kueue                                                  | here                                      |
|--------------------------------------------------------|-------------------------------------------|
| webhook, Job create only: no queue-name label and a    | the same (pkg/controller/jobs/job/        |
| LocalQueue `default` in the namespace: labelled        | job_webhook.go Default; pkg/controller/   |
| `kueue.x-k8s.io/queue-name: default`                   | jobframework/defaults.go                  |
|                                                        | ApplyDefaultLocalQueue)                   |
| then suspended when it has the label, or when          | the same (jobframework/utils.go           |
| manageJobsWithoutQueueName is on                       | WorkloadShouldBeSuspended)                |
| the job controller creates a Workload                  | the same: `job-<name>-<sha1[:5]>`, podSet |
| `job-<name>-<hash>`, controller-owned by the Job,      | `main` of `parallelism` pods (jobframe-   |
| label kueue.x-k8s.io/job-uid, spec.queueName           | work/reconciler.go ConstructWorkload,     |
|                                                        | workload_names.go; jobs/job/              |
|                                                        | job_controller.go PodSets)                |
| its LocalQueue missing: QuotaReserved False            | the same (pkg/controller/core/            |
| Inadmissible "LocalQueue q doesn't exist"              | workload_controller.go)                   |
| no quota: QuotaReserved False Pending "couldn't assign | the same (pkg/scheduler/scheduler.go,     |
| flavors to pod set main: insufficient unused quota..." | flavorassigner/flavorassigner.go)         |
| admitted: QuotaReserved and Admitted True, Evicted     | `admit(job)` (pkg/workload/workload.go    |
| reset, status.admission; the Job un-suspended          | SetQuotaReservation; reconciler.go step 7)|
| evicted (preempted, PodsReadyTimeout): Evicted True,   | `evict(job)` (reconciler.go step 6:       |
| the Job suspended, quota released (QuotaReserved False | stopJob, UnsetQuotaReservationWith-       |
| Pending), Requeued                                     | Condition)                                |
| a Job un-suspended while its Workload is not admitted  | the same, at once; `unsuspended` names    |
| is suspended again ("Not admitted by cluster queue")   | each (reconciler.go step 8)               |

Not modelled: the pod, deployment and pod-group integrations, admission checks, flavors
injected into the pod template on admission, the Workload's finalizer, waitForPodsReady's
timers (a test calls `evict`), MultiKueue.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import uuid

import kmock

from tests.integration.operator.emulator import VERBS

API = "kueue.x-k8s.io/v1beta2"
WORKLOADS, LOCALQUEUES = f"{API}/workloads", f"{API}/localqueues"
JOBS = "batch/v1/jobs"
QUEUE_NAME = "kueue.x-k8s.io/queue-name"
JOB_UID = "kueue.x-k8s.io/job-uid"
DEFAULT_QUEUE = "default"
NO_QUOTA = ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor "
            "default-flavor, 1 more needed")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, status: bool, reason: str, message: str = "") -> dict:
    return {"type": kind, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": _now(), "observedGeneration": 1}


def _set(conditions: list[dict], *new: dict) -> list[dict]:
    kinds = {c["type"] for c in new}
    return [c for c in conditions if c["type"] not in kinds] + list(new)


def workload_name(job: str, uid: str) -> str:
    """GetWorkloadNameForOwnerWithGVK: `<kind>-<name>-` and 5 hex digits of a sha1 over the
    kind, group, name and uid."""
    digest = hashlib.sha1("\n".join(("Job", "batch", job, uid)).encode()).hexdigest()
    return f"job-{job}-{digest[:5]}"


class Kueue:
    """Kueue installed in the emulated cluster (its CRDs served, its webhook and controllers
    on). `manage_jobs_without_queue_name`: the configuration's manageJobsWithoutQueueName."""

    def __init__(self, emulator: kmock.KubernetesEmulator, manage_jobs_without_queue_name: bool = False):
        self.emulator = emulator
        self.manage_jobs_without_queue_name = manage_jobs_without_queue_name
        self.unsuspended: list[str] = []
        """Jobs ("namespace/name") someone but Kueue un-suspended while not admitted."""
        for plural, kind in ((WORKLOADS, "Workload"), (LOCALQUEUES, "LocalQueue")):
            emulator.resources[plural] = kmock.ResourceInfo(kind=kind, singular=kind.lower(), namespaced=True,
                                                            verbs=VERBS, subresources={"status"})
        emulator.controllers.append(self)

    # ---- reading the store -----------------------------------------------------------
    def _get(self, resource: str, namespace: str, name: str) -> dict | None:
        try:
            obj = self.emulator.objects[resource, namespace, name]
        except KeyError:
            return None
        return None if obj.deleted else copy.deepcopy(dict(obj.raw))

    def workload(self, namespace: str, job: str) -> dict | None:
        """The Workload of the Job `job`, as stored."""
        current = self._get(JOBS, namespace, job)
        return current and self._get(WORKLOADS, namespace, workload_name(job, current["metadata"]["uid"]))

    # ---- writing the store, as a controller does -------------------------------------
    async def _write(self, resource: str, namespace: str, name: str, change) -> dict:
        """`change` applied to the stored object (a new one when `change` gets None and
        returns it); a watch event, a new resourceVersion, generation +1 on a spec change."""
        emulator, res = self.emulator, kmock.resource(resource)
        key = (res, namespace, name)
        async with emulator._lock:
            current = self._get(resource, namespace, name)
            new = change(copy.deepcopy(current))
            meta = new["metadata"]
            if current is None:
                meta.update(namespace=namespace, uid=str(uuid.uuid4()), generation=1, creationTimestamp=_now())
                meta["resourceVersion"] = emulator._next_rv()
                emulator._objects[key] = new
                event = "ADDED"
            else:
                if new == current:
                    return current
                if new.get("spec") != current.get("spec"):
                    meta["generation"] = int(current["metadata"].get("generation") or 1) + 1
                meta["resourceVersion"] = emulator._next_rv()
                emulator._objects[key].patch(emulator._replacement(current, new))
                event = "MODIFIED"
            raw = emulator._objects[key].raw
            await emulator._buses[res].put({"type": event, "object": raw})
            return copy.deepcopy(dict(raw))

    async def local_queue(self, namespace: str, name: str = DEFAULT_QUEUE, cluster_queue: str = "cluster-queue"):
        """A LocalQueue (an administrator's)."""
        await self._write(LOCALQUEUES, namespace, name, lambda _: {
            "apiVersion": API, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue}})

    # ---- the webhook -----------------------------------------------------------------
    def _managed(self, body: dict) -> bool:
        return QUEUE_NAME in (body["metadata"].get("labels") or {}) or self.manage_jobs_without_queue_name

    def mutate(self, resource, namespace: str, body: dict) -> None:
        """The batch/Job mutating webhook, on create."""
        if (resource.group, resource.plural) != ("batch", "jobs"):
            return
        labels = body["metadata"].setdefault("labels", {})
        if QUEUE_NAME not in labels and self._get(LOCALQUEUES, namespace, DEFAULT_QUEUE) is not None:
            labels[QUEUE_NAME] = DEFAULT_QUEUE
        if self._managed(body):
            body.setdefault("spec", {})["suspend"] = True

    # ---- the job controller ----------------------------------------------------------
    async def written(self, resource, namespace: str, name: str, created: bool) -> None:
        if (resource.group, resource.plural) != ("batch", "jobs"):
            return
        job = self._get(JOBS, namespace, name)
        if job is None or not self._managed(job):
            return
        if created:
            await self._create_workload(job)
        elif not (job.get("spec") or {}).get("suspend") and not self._admitted(namespace, name):
            self.unsuspended.append(f"{namespace}/{name}")
            await self._suspend(namespace, name, True)

    def _admitted(self, namespace: str, job: str) -> bool:
        conditions = ((self.workload(namespace, job) or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions)

    async def _suspend(self, namespace: str, job: str, suspend: bool) -> None:
        def change(current):
            current["spec"]["suspend"] = suspend
            return current
        await self._write(JOBS, namespace, job, change)

    async def _create_workload(self, job: dict) -> None:
        meta, namespace = job["metadata"], job["metadata"]["namespace"]
        queue = (meta.get("labels") or {}).get(QUEUE_NAME, "")
        if self._get(LOCALQUEUES, namespace, queue) is None:
            waiting = _condition("QuotaReserved", False, "Inadmissible", f"LocalQueue {queue} doesn't exist")
        else:
            waiting = _condition("QuotaReserved", False, "Pending", NO_QUOTA)
        name = workload_name(meta["name"], meta["uid"])
        await self._write(WORKLOADS, namespace, name, lambda _: {
            "apiVersion": API, "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace, "labels": {JOB_UID: meta["uid"]},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"queueName": queue, "podSets": [{"name": "main", "count": job["spec"].get("parallelism", 1),
                                                      "template": job["spec"]["template"]}]},
            "status": {"conditions": [waiting]}})

    # ---- the scheduler's verdicts ----------------------------------------------------
    async def admit(self, namespace: str, job: str, cluster_queue: str = "cluster-queue") -> None:
        """The Workload gets quota and is admitted; the job controller un-suspends the Job."""
        def change(workload):
            status = workload.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or [] if c["type"] != "Evicted"] + \
                ([_condition("Evicted", False, "QuotaReserved")] if any(
                    c["type"] == "Evicted" for c in status.get("conditions") or []) else [])
            status["conditions"] = _set(conditions, _condition("QuotaReserved", True, "QuotaReserved",
                                                               f"Quota reserved in ClusterQueue {cluster_queue}"),
                                        _condition("Admitted", True, "Admitted",
                                                   "The workload is admitted"))
            status["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": [
                {"name": "main", "count": workload["spec"]["podSets"][0]["count"]}]}
            return workload
        current = self.workload(namespace, job)
        assert current is not None, f"no Workload for Job {namespace}/{job}"
        await self._write(WORKLOADS, namespace, current["metadata"]["name"], change)
        await self._suspend(namespace, job, False)

    async def evict(self, namespace: str, job: str, reason: str = "Preempted",
                    message: str = "Preempted to accommodate a workload due to prioritization in the ClusterQueue"):
        """The Workload is evicted: the Job suspended, the quota released, the Workload requeued."""
        def change(workload):
            status = workload.setdefault("status", {})
            status["conditions"] = _set(status.get("conditions") or [], _condition("Evicted", True, reason, message),
                                        _condition("QuotaReserved", False, "Pending", message),
                                        _condition("Admitted", False, "NoReservation", "The workload has no "
                                                                                       "reservation"),
                                        _condition("Requeued", True, reason, message))
            status.pop("admission", None)
            return workload
        current = self.workload(namespace, job)
        assert current is not None, f"no Workload for Job {namespace}/{job}"
        await self._suspend(namespace, job, True)
        await self._write(WORKLOADS, namespace, current["metadata"]["name"], change)
