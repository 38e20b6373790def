"""Pure functions from an RLJob to every Kubernetes object it needs. No I/O: the kopf
handlers call these and apply the results; tests validate them against Kubernetes's own
schemas.

Per job: a ConfigMap holding the spec every service loads; the trainer as an Indexed Job
(one pod per trainer node, `processesPerNode` ranks in each started by torch.distributed.run;
its exit is the run's outcome) with a headless Service that gives its pods stable names for
the rendezvous, and a Service selecting only the index-0 pod (rank 0), the one endpoint
generators dial; the trainer's run directory on a PersistentVolumeClaim when
checkpoint.volume asks (created here unless it names an existing claim), so checkpoints
outlive its pods; the ranker as a Deployment and Service (skewness-aware dispatch only); one
generator Deployment per pool, with that pool's node selector, tolerations, GPUs and template.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from streamrl.operator.settings import Settings
from streamrl.spec import API_VERSION, GROUP, KIND, TLS_MOUNT, RLJob, SpecError, dump_job

TRAINER_GRPC_PORT, RANKER_GRPC_PORT, RELAY_PORT, ADMIN_PORT = 50051, 50052, 50053, 8080
RENDEZVOUS_PORT = 29500
"""torch.distributed's TCP store on the trainer's index-0 pod (torchrun's default port)."""
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
"""The label (and env JOB_COMPLETION_INDEX) the Job controller gives each pod of an Indexed Job."""
TEMPLATE_HASH = "streamrl.io/trainer-template-hash"
"""Annotation on the trainer Job: a hash of what a running Job cannot change (a different one
means the operator replaces the whole group)."""
RESTARTS = "streamrl.io/group-restarts"
"""Annotation on the trainer Job: how many times the whole group was restarted before it."""
PREEMPTED_EXIT_CODE = 75
"""EX_TEMPFAIL: a trainer stopped by SIGTERM saves a checkpoint and exits with this (phase
Preempted). Its Job fails through the pod failure policy's first rule, which the operator
reads as a preemption: the group is restarted without spending the restart budget."""
TRAINER_GRACE_S = 300
"""A trainer pod's terminationGracePeriodSeconds (unless its placement.template sets one):
time, after SIGTERM (suspend, a drained node, an eviction), to finish the step and save."""
LAUNCHER_MARGIN_S = 15
"""Of the grace period, what torch.distributed.run keeps for itself: its ranks get the rest
to save before it kills them."""
HOSTNAME_MAX = 63
SPEC_MOUNT, OUT_MOUNT, CACHE_MOUNT = "/etc/streamrl/job", "/var/lib/streamrl/out", "/var/cache/streamrl"
JOB_FILE = f"{SPEC_MOUNT}/job.yaml"
MAIN = "main"
"""Name of the container every role runs in (pod templates merge into it)."""


# ---- names and labels ---------------------------------------------------------------
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


def selector(job: str, role: str, pool: str | None = None) -> dict[str, str]:
    """The labels that select a role's pods (a subset of labels(); stable for Deployments)."""
    out = {f"{GROUP}/job": job, f"{GROUP}/role": role}
    if pool:
        out[f"{GROUP}/pool"] = pool
    return out


def generator_selector(job: str) -> str:
    """Every generator pod of the job, serialized (the /scale subresource's labelSelector)."""
    return f"{GROUP}/job={job},{GROUP}/role=generator"


def owner_reference(body: dict) -> dict:
    """Children in the RLJob's own cluster are garbage-collected with it."""
    meta = body["metadata"]
    return {"apiVersion": body.get("apiVersion", API_VERSION), "kind": body.get("kind", KIND),
            "name": meta["name"], "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def _meta(job: RLJob, obj_name: str, namespace: str, lbls: dict[str, str], owner: dict | None) -> dict:
    meta = {"name": obj_name, "namespace": namespace, "labels": lbls}
    if owner:
        meta["ownerReferences"] = [owner]
    return meta


# ---- pod templates ------------------------------------------------------------------
def merge(base: Any, override: Any) -> Any:
    """Deep-merge `override` onto `base`: maps key by key, lists of named items (containers,
    volumes, env, ports...) item by name, anything else replaced by `override`."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(override, list) and all(
            isinstance(x, dict) and "name" in x for x in base + override):
        out = [copy.deepcopy(x) for x in base]
        index = {x["name"]: i for i, x in enumerate(out)}
        for item in override:
            if item["name"] in index:
                out[index[item["name"]]] = merge(out[index[item["name"]]], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(override)


def _resources(placement) -> dict:
    res = copy.deepcopy(placement.resources) or {}
    if placement.gpus:
        for kind in ("requests", "limits"):
            res.setdefault(kind, {})[placement.gpu_resource] = placement.gpus
    return res


def pod_template(job: RLJob, role: str, placement, args: list[str], ports: dict[str, int], settings: Settings,
                 pool: str | None = None, env: list[dict] | None = None, restart_policy: str | None = None,
                 out_volume: dict | None = None) -> dict:
    """The pod template of one role: the operator's part, with the user's template merged
    under it (the operator's fields win, the user's extra ones are kept). `out_volume`: the
    source of the run directory (default: the pod's own disk)."""
    spec = job.spec
    volumes = [
        {"name": "job", "configMap": {"name": name(job.metadata.name, "spec")}},
        {"name": "out", **(out_volume or {"emptyDir": {}})},
        {"name": "cache", "emptyDir": {}},
    ]
    mounts = [
        {"name": "job", "mountPath": SPEC_MOUNT, "readOnly": True},
        {"name": "out", "mountPath": OUT_MOUNT},
        {"name": "cache", "mountPath": CACHE_MOUNT},
    ]
    if spec.security.tls and spec.security.tls.secret_name:
        volumes.append({"name": "tls", "secret": {"secretName": spec.security.tls.secret_name}})
        mounts.append({"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True})
    probe = {"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 10, "failureThreshold": 6}
    container = {
        "name": MAIN,
        "image": spec.image or settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "args": args,
        "env": [
            {"name": "STREAMRL_CACHE_DIR", "value": CACHE_MOUNT},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            # MKL reads its default once, at start: only the compute thread (streamrl.compute) runs
            # its products on the process's threads
            {"name": "MKL_NUM_THREADS", "value": "1"},
            *(env or []),
        ],
        "ports": [{"name": k, "containerPort": v, "protocol": "TCP"} for k, v in ports.items()],
        "volumeMounts": mounts,
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 5,
                         "failureThreshold": 120},
        "livenessProbe": probe,
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "admin"}, "periodSeconds": 5},
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    resources = _resources(placement)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001},
        "enableServiceLinks": False,
    }
    if placement.node_selector:
        pod_spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(placement.tolerations)
    if restart_policy:
        pod_spec["restartPolicy"] = restart_policy
    ours = {"metadata": {"labels": labels(job.metadata.name, role, pool)}, "spec": pod_spec}
    user = copy.deepcopy(placement.template or {})
    return merge(user, ours) if user else ours


# ---- objects ------------------------------------------------------------------------
def service_spec(job: RLJob) -> RLJob:
    """The spec the pods load: fixed ports (Services point at them)."""
    spec = job.spec
    trainer = spec.trainer.model_copy(update={"port": TRAINER_GRPC_PORT, "admin_port": ADMIN_PORT})
    ranker = spec.ranker.model_copy(update={"port": RANKER_GRPC_PORT, "admin_port": ADMIN_PORT})
    return job.model_copy(update={"spec": spec.model_copy(update={"trainer": trainer, "ranker": ranker}),
                                  "status": None})


def build_configmap(job: RLJob, namespace: str, owner: dict | None = None) -> dict:
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": _meta(job, name(job.metadata.name, "spec"), namespace, labels(job.metadata.name, "spec"), owner),
        "data": {"job.yaml": dump_job(service_spec(job))},
    }


def uses_ranker(job: RLJob) -> bool:
    return job.spec.generators.dispatch.policy == "skewness-aware"


def grace_s(job: RLJob) -> int:
    """Seconds a trainer pod has after SIGTERM: its template's terminationGracePeriodSeconds,
    else TRAINER_GRACE_S."""
    own = ((job.spec.trainer.placement.template or {}).get("spec") or {}).get("terminationGracePeriodSeconds")
    return own if isinstance(own, int) and own >= 0 else TRAINER_GRACE_S


def trainer_args(job: RLJob, namespace: str) -> tuple[list[str] | None, list[str]]:
    """(command, args) of a trainer pod's container. One rank: the image's `streamrl trainer`.
    More: torch.distributed.run starts `processesPerNode` ranks with the node rank from the
    Job's completion index, rendezvous at the index-0 pod's stable name; each rank serves its
    admin on ADMIN_PORT + its local rank (the configmap's trainer.adminPort). On SIGTERM it
    passes the signal to its ranks and waits for them (they save) almost the whole grace
    period (its own default is 30 s), then exits 1 whatever their status: a sharded group
    stopped that way is told from a failure by the suspension or the pod's DisruptionTarget
    condition, not by the exit code (see reconcile.preemption)."""
    j, trainer = job.metadata.name, job.spec.trainer
    args = ["trainer", JOB_FILE, "--out", OUT_MOUNT, "--host", "0.0.0.0",
            "--preempted-exit-code", str(PREEMPTED_EXIT_CODE)]
    if uses_ranker(job):
        args += ["--ranker", f"{name(j, 'ranker')}:{RANKER_GRPC_PORT}"]
    if trainer.world_size == 1:
        return None, args + ["--admin-port", str(ADMIN_PORT)]
    master = f"{name(j, 'trainer')}-0.{name(j, 'trainer-ranks')}.{namespace}.svc"
    command = ["python", "-m", "torch.distributed.run", "--nnodes", str(trainer.nodes),
               "--nproc-per-node", str(trainer.processes_per_node), "--node-rank", "$(JOB_COMPLETION_INDEX)",
               "--master-addr", master, "--master-port", str(RENDEZVOUS_PORT), "--max-restarts", "0",
               "--shutdown-timeout", str(max(grace_s(job) - LAUNCHER_MARGIN_S, 1)), "--no-python", "streamrl"]
    return command, args


def admin_ports(job: RLJob) -> dict[str, int]:
    """A trainer pod's admin ports: `admin` for local rank 0, `admin-rN` for local rank N."""
    return {"admin" if r == 0 else f"admin-r{r}": ADMIN_PORT + r for r in range(job.spec.trainer.processes_per_node)}


def template_hash(spec: dict) -> str:
    """What a Job cannot change while it exists: its spec but `suspend` (which it can)."""
    fixed = {k: v for k, v in spec.items() if k != "suspend"}
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


def claim_name(job: RLJob) -> str | None:
    """The PersistentVolumeClaim of the trainer's run directory (None: the pod's own disk)."""
    volume = job.spec.checkpoint.volume
    if volume is None:
        return None
    return volume.claim_name or name(job.metadata.name, "checkpoints")


def build_checkpoint_claim(job: RLJob, namespace: str, owner: dict | None = None) -> dict | None:
    """The claim the operator creates for checkpoint.volume (None when there is no volume or
    it names an existing claim). ReadWriteMany when several trainer pods write their shards
    into it, unless accessMode says otherwise. Retained (no owner reference, so the garbage
    collector keeps it when the RLJob goes) unless `retain: false`."""
    volume, j = job.spec.checkpoint.volume, job.metadata.name
    if volume is None or volume.claim_name:
        return None
    mode = volume.access_mode or ("ReadWriteOnce" if job.spec.trainer.nodes == 1 else "ReadWriteMany")
    spec: dict[str, Any] = {"accessModes": [mode], "resources": {"requests": {"storage": volume.size}}}
    if volume.storage_class:
        spec["storageClassName"] = volume.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(job, name(j, "checkpoints"), namespace, labels(j, "checkpoints"),
                              None if volume.retain else owner),
            "spec": spec}


def build_trainer(job: RLJob, namespace: str, settings: Settings, owner: dict | None = None,
                  restarts: int = 0) -> dict:
    """The trainer as an Indexed Job, the way JobSet and the Kubeflow trainer build one:
    parallelism = completions = trainer.nodes, pods named `<job>-trainer-<index>` under the
    headless Service, the run directory on the checkpoint claim when there is one. Any pod
    failing fails the Job (the pod failure policy; the operator then restarts the whole group,
    never half of it: within its budget, or free when the failure was a preemption: exit code
    PREEMPTED_EXIT_CODE first, a disruption next); rank 0 (index 0) finishing completes it."""
    j, trainer = job.metadata.name, job.spec.trainer
    if len(f"{name(j, 'trainer')}-{trainer.nodes - 1}") > HOSTNAME_MAX:
        raise SpecError(f"metadata.name: {j!r} is too long for a trainer of {trainer.nodes} nodes: its pods' "
                        f"hostnames <name>-trainer-<index> must fit in {HOSTNAME_MAX} characters")
    command, args = trainer_args(job, namespace)
    ports = {"grpc": TRAINER_GRPC_PORT, **admin_ports(job)}
    if trainer.world_size > 1:
        ports["rendezvous"] = RENDEZVOUS_PORT
    claim = claim_name(job)
    template = pod_template(job, "trainer", trainer.placement, args, ports, settings, restart_policy="Never",
                            out_volume={"persistentVolumeClaim": {"claimName": claim}} if claim else None)
    if command:
        template["spec"]["containers"][0]["command"] = command
    template["spec"]["subdomain"] = name(j, "trainer-ranks")
    template["spec"]["terminationGracePeriodSeconds"] = grace_s(job)
    spec = {
        "completionMode": "Indexed", "completions": trainer.nodes, "parallelism": trainer.nodes,
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": [  # in order, the first match decides (the operator reads which)
            {"action": "FailJob", "onExitCodes": {"containerName": MAIN, "operator": "In",
                                                  "values": [PREEMPTED_EXIT_CODE]}},
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": MAIN, "operator": "NotIn", "values": [0]}},
        ]},
        "successPolicy": {"rules": [{"succeededIndexes": "0"}]},
        "suspend": job.spec.suspend,
        "template": template,
    }
    meta = _meta(job, name(j, "trainer"), namespace, labels(j, "trainer"), owner)
    meta["annotations"] = {TEMPLATE_HASH: template_hash(spec), RESTARTS: str(restarts)}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


def build_trainer_service(job: RLJob, namespace: str, owner: dict | None = None) -> dict:
    """The endpoint generators and the operator dial: rank 0 alone (the index-0 pod)."""
    j = job.metadata.name
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(job, name(j, "trainer"), namespace, labels(j, "trainer"), owner),
        "spec": {"type": job.spec.trainer.service_type,
                 "selector": {**selector(j, "trainer"), COMPLETION_INDEX: "0"},
                 "ports": [{"name": "grpc", "port": TRAINER_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                           {"name": "admin", "port": ADMIN_PORT, "targetPort": "admin", "protocol": "TCP"}]},
    }


def build_trainer_ranks_service(job: RLJob, namespace: str, owner: dict | None = None) -> dict:
    """Headless, for the rendezvous: every trainer pod gets a DNS name
    (<job>-trainer-<index>.<job>-trainer-ranks), published before it is ready (ranks meet
    before any of them serves)."""
    j = job.metadata.name
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(job, name(j, "trainer-ranks"), namespace, labels(j, "trainer"), owner),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector(j, "trainer"),
                 "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT,
                            "protocol": "TCP"}]},
    }


def _deployment(job: RLJob, namespace: str, role: str, replicas: int, template: dict, owner: dict | None,
                pool: str | None = None) -> dict:
    j = job.metadata.name
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(job, name(j, role if role != "generator" else "gen", pool), namespace,
                          labels(j, role, pool), owner),
        "spec": {"replicas": 0 if job.spec.suspend else replicas, "selector": {"matchLabels": selector(j, role, pool)},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                 "template": template},
    }


def build_ranker(job: RLJob, namespace: str, settings: Settings, owner: dict | None = None) -> list[dict]:
    """The ranker's Deployment and Service (its state in the pod; a restart relearns from history)."""
    j = job.metadata.name
    args = ["ranker", JOB_FILE, "--host", "0.0.0.0", "--admin-port", str(ADMIN_PORT),
            "--state", f"{OUT_MOUNT}/ranker.npz"]
    template = pod_template(job, "ranker", job.spec.ranker.placement, args,
                            {"grpc": RANKER_GRPC_PORT, "admin": ADMIN_PORT}, settings)
    deployment = _deployment(job, namespace, "ranker", 1, template, owner)
    deployment["spec"]["strategy"] = {"type": "Recreate"}
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(job, name(j, "ranker"), namespace, labels(j, "ranker"), owner),
        "spec": {"selector": selector(j, "ranker"),
                 "ports": [{"name": "grpc", "port": RANKER_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"}]},
    }
    return [deployment, service]


def build_generators(job: RLJob, pool_name: str, namespace: str, settings: Settings, trainer_address: str,
                     owner: dict | None = None, origin: dict[str, str] | None = None) -> dict:
    """One pool's Deployment. `trainer_address` is host:port of the trainer's Service (in
    another cluster: its external address); `origin` labels mark objects made for a job in
    another cluster."""
    pools = {p.name: p for p in job.spec.generators.pools}
    pool = pools[pool_name]
    replicas = job.spec.generators.pool_replicas()[pool_name]
    args = ["generator", JOB_FILE, "--trainer", trainer_address, "--pool", pool_name, "--id", "$(POD_NAME)",
            "--host", "0.0.0.0", "--admin-port", str(ADMIN_PORT), "--relay-port", str(RELAY_PORT),
            "--advertise-host", "$(POD_IP)"]
    template = pod_template(job, "generator", pool.placement, args, {"relay": RELAY_PORT, "admin": ADMIN_PORT},
                            settings, pool=pool_name)
    deployment = _deployment(job, namespace, "generator", replicas, template, owner, pool_name)
    if origin:
        deployment["metadata"]["labels"].update(origin)
        template["metadata"]["labels"].update(origin)
    return deployment


def build_children(job: RLJob, namespace: str, settings: Settings, owner: dict | None = None) -> list[dict]:
    """Every object in the RLJob's own cluster (pools with a clusterRef are built apart)."""
    j = job.metadata.name
    trainer_address = f"{name(j, 'trainer')}.{namespace}.svc:{TRAINER_GRPC_PORT}"
    claim = build_checkpoint_claim(job, namespace, owner)
    out = [build_configmap(job, namespace, owner), *([claim] if claim else []),
           build_trainer(job, namespace, settings, owner),
           build_trainer_service(job, namespace, owner), build_trainer_ranks_service(job, namespace, owner)]
    if uses_ranker(job):
        out += build_ranker(job, namespace, settings, owner)
    for pool in job.spec.generators.pools:
        if not pool.cluster_ref:
            out.append(build_generators(job, pool.name, namespace, settings, trainer_address, owner))
    return out

