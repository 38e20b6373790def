"""Names, labels, annotations and ports every child of an RLJob carries: one place, so the
builders, the reconciler, the status and the CRD's name rule agree. Pure."""

from __future__ import annotations

from streamrl.spec import API_VERSION, GROUP, KIND

TRAINER_GRPC_PORT, RANKER_GRPC_PORT, RELAY_PORT, ADMIN_PORT = 50051, 50052, 50053, 8080
RENDEZVOUS_PORT = 29500
"""torch.distributed's TCP store on the trainer's index-0 pod (torchrun's default port)."""
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
"""The label (and env JOB_COMPLETION_INDEX) the Job controller gives each pod of an Indexed Job."""
TEMPLATE_HASH = f"{GROUP}/trainer-template-hash"
"""Annotation on the trainer Job: a hash of what a running Job cannot change (a different one
means the operator replaces the whole group)."""
OPERATOR_VERSION = f"{GROUP}/operator-version"
"""Annotation on the trainer Job: the operator version that built it (an upgrade does not
replace a running group; this says which operator's pods it runs)."""
JOB_UID = f"{GROUP}/job-uid"
"""Annotation on the checkpoint claim the operator made: the uid of the RLJob it was made for
(a retained claim outlives its job; a new job of the same name must not resume from it unawares)."""
ADOPT_CHECKPOINTS = f"{GROUP}/adopt-checkpoints"
"""Annotation a user sets ("true") on an RLJob to resume from the checkpoints an earlier RLJob
of the same name left on its retained claim."""
CONFIG_HASH = f"{GROUP}/config-hash"
"""Annotation on every pod template: a hash of the spec its pods load from the ConfigMap (less
what they do not read: replicas, placement), so a spec change that reaches only the
ConfigMap still rolls the pods."""
RESTARTS = f"{GROUP}/group-restarts"
"""Annotation on the trainer Job: how many times the whole group was restarted before it."""
SUSPENDED_BY = f"{GROUP}/suspended-by"
"""Annotation on the trainer Job the operator itself suspended (spec.suspend): the only
suspension it ever lifts (a Job suspended by Kueue or another queue waits for it)."""
QUEUE_NAME = "kueue.x-k8s.io/queue-name"
"""Kueue's label: an RLJob carrying it hands its workloads to that LocalQueue (the trainer Job
is admitted as one workload; Kueue, not the operator, then owns the Job's `suspend`)."""
MAIN = "main"
"""Name of the container every role runs in (pod templates merge into it)."""
HOSTNAME_MAX = 63


def name(job: str, role: str, pool: str | None = None) -> str:
    return f"{job}-{role}" + (f"-{pool}" if pool else "")


def labels(job: str, role: str, pool: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "streamrl",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/managed-by": "streamrl-operator",
        f"{GROUP}/job": job,
        f"{GROUP}/role": role,
    }
    if pool:
        out[f"{GROUP}/pool"] = pool
    return out


def selector(job: str, role: str | None = None, pool: str | None = None) -> dict[str, str]:
    """The labels that select a role's pods (a subset of labels(); stable for Deployments);
    no role: every pod of the job."""
    out = {f"{GROUP}/job": job}
    if role:
        out[f"{GROUP}/role"] = role
    if pool:
        out[f"{GROUP}/pool"] = pool
    return out


def serialized(labels_: dict[str, str]) -> str:
    """A label selector's string form (k=v,k=v)."""
    return ",".join(f"{k}={v}" for k, v in labels_.items())


def generator_selector(job: str) -> str:
    """Every generator pod of the job, serialized (the /scale subresource's labelSelector)."""
    return serialized(selector(job, "generator"))


def owner_reference(body: dict) -> dict:
    """Children in the RLJob's own cluster are garbage-collected with it."""
    meta = body["metadata"]
    return {"apiVersion": body.get("apiVersion", API_VERSION), "kind": body.get("kind", KIND),
            "name": meta["name"], "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def object_meta(obj_name: str, namespace: str, lbls: dict[str, str], owner: dict | None) -> dict:
    meta = {"name": obj_name, "namespace": namespace, "labels": lbls}
    if owner:
        meta["ownerReferences"] = [owner]
    return meta
