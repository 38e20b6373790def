"""Pure functions from an RLJob to every Kubernetes object it needs. No I/O: the kopf
handlers call these and apply the results; `streamrl render` prints them; tests validate
them against Kubernetes's own schemas.

Per job: a ConfigMap holding the spec every service loads; the trainer as an Indexed Job
(one pod per trainer node, `processesPerNode` ranks in each started by torch.distributed.run;
rank 0's exit is the run's outcome) with a headless Service that gives its pods stable names
for the rendezvous, a Service selecting only the index-0 pod (rank 0), the one endpoint
generators dial, and a ClusterIP Service for rank 0's admin port (never exposed with the
first); the trainer's run directory on a PersistentVolumeClaim when checkpoint.volume asks
(created here unless it names an existing claim), so checkpoints outlive its pods; the ranker
as a Deployment and Service (skewness-aware dispatch only); one generator Deployment per
pool, with that pool's node selector, tolerations, GPUs and template; and the perimeter
(perimeter.py): the job's token Secret and its NetworkPolicies. A finished job's
Deployments are built at 0 replicas: it keeps no GPU; so are a queued job's, held while
Kueue has not admitted its trainer Job (admission.py).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from streamrl import __version__
from streamrl.operator.names import (
    ADMIN_PORT,
    COMPLETION_INDEX,
    HOSTNAME_MAX,
    JOB_UID,
    MAIN,
    OPERATOR_VERSION,
    QUEUE_NAME,
    RANKER_GRPC_PORT,
    RELAY_PORT,
    RENDEZVOUS_PORT,
    RESTARTS,
    SUSPENDED_BY,
    TEMPLATE_HASH,
    TRAINER_GRPC_PORT,
    labels,
    name,
    object_meta,
    selector,
)
from streamrl.operator.perimeter import build_network_policies, build_token_secret
from streamrl.operator.pods import CACHE_MOUNT, JOB_FILE, OUT_MOUNT, check_devices, minted_token, pod_template
from streamrl.operator.settings import Settings
from streamrl.operator.sources import apply_model_parts, model_parts, task_path
from streamrl.spec import TOKEN_MOUNT, RLJob, SpecError, dump_job

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
TRAINER_STARTUP_S = 120
"""A trainer of one process: seconds from its container's start to its admin server (imports
and the process group; the model loads after, under trainer.startup.loadSeconds)."""
RENDEZVOUS_MARGIN_S = 300
"""A trainer of several processes: seconds its startup probe allows beyond the rendezvous
bound (torch.distributed.run's start, then its ranks' imports and process group)."""
TRAINER_POD_ANNOTATIONS = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                           "karpenter.sh/do-not-disrupt": "true"}
"""A node autoscaler consolidating nodes would stop the whole group for a node it could empty."""
BIND_ANY = "::"
"""Where every service listens: each address of the pod, IPv6 and IPv4 (a dual-stack socket),
so probes, Services and peers reach it on IPv4, IPv6 and dual-stack clusters alike."""
RANKER_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}}
"""The ranker's requests when its placement names none (not BestEffort: evicted last, not first)."""
TOKEN_FILE = f"{TOKEN_MOUNT}/token"


# ---- the spec the pods load ---------------------------------------------------------
def service_spec(job: RLJob) -> RLJob:
    """The spec the pods load: fixed ports (Services point at them), the minted token's file,
    a task file on a claim named by its path in the trainer's pods."""
    spec = job.spec
    trainer = spec.trainer.model_copy(update={"port": TRAINER_GRPC_PORT, "admin_port": ADMIN_PORT})
    ranker = spec.ranker.model_copy(update={"port": RANKER_GRPC_PORT, "admin_port": ADMIN_PORT})
    update: dict[str, Any] = {"trainer": trainer, "ranker": ranker}
    if (path := task_path(job)) is not None:  # the task's file on its claim, as mounted in the trainer's pods
        update["task"] = spec.task.model_copy(update={"path": path, "pvc": None})
    if minted_token(job):
        update["security"] = spec.security.model_copy(update={"token_file": TOKEN_FILE})
    return job.model_copy(update={"spec": spec.model_copy(update=update), "status": None})


def _loaded(job: RLJob) -> dict:
    """The spec the pods load, less what no running pod acts on (see config_hash); the ranker's
    section under "ranker" and the pools by name under "pools", for the caller to keep or drop."""
    spec = service_spec(job).spec.model_dump(mode="json", by_alias=True)
    for key in ("suspend", "image", "autoscaling"):
        spec.pop(key, None)
    generators = spec["generators"]
    generators.pop("replicas", None)
    spec["pools"] = {p["name"]: p for p in generators.pop("pools")}
    for key in ("placement", "service", "serviceType", "externalHost"):
        spec["trainer"].pop(key, None)
    spec["checkpoint"].pop("volume", None)
    return spec


def config_hash(job: RLJob, role: str = "trainer", pool: str | None = None) -> str:
    """A hash of what a role's pods read from the ConfigMap, less what no running pod acts on
    (replicas and their bounds, which the autoscaler and /scale write, placement, suspension,
    autoscaling, the trainer's Service, the checkpoint volume): a new value rolls the role.
    The ranker's section is the ranker's, a pool's the pool's: adding or changing a pool rolls
    neither the trainer (a trainer restart costs the steps since its checkpoint; a pool it
    does not know yet fetches weights without relay) nor the other pools."""
    spec = _loaded(job)
    ranker = spec.pop("ranker")
    pools = spec.pop("pools")
    if role != "trainer":
        spec["trainer"].pop("startup", None)  # the trainer's alone
    if role == "ranker":
        ranker.pop("placement", None)
        spec["ranker"] = ranker
    elif role == "generator":
        own = pools[pool]
        for key in ("replicas", "minReplicas", "maxReplicas", "cost", "placement"):
            own.pop(key, None)
        spec["pool"] = own
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def build_configmap(job: RLJob, namespace: str, owner: dict | None = None,
                    origin: dict[str, str] | None = None) -> dict:
    j = job.metadata.name
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": object_meta(name(j, "spec"), namespace, {**labels(j, "spec"), **(origin or {})}, owner),
        "data": {"job.yaml": dump_job(service_spec(job))},
    }


def uses_ranker(job: RLJob) -> bool:
    return job.spec.generators.dispatch.policy == "skewness-aware"


def queue_name(job: RLJob) -> str | None:
    """Kueue's LocalQueue the job's metadata names (label kueue.x-k8s.io/queue-name), if any."""
    return job.metadata.labels.get(QUEUE_NAME)


def _queued(job: RLJob) -> dict[str, str]:
    queue = queue_name(job)
    return {QUEUE_NAME: queue} if queue else {}


# ---- the trainer --------------------------------------------------------------------
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
    args = ["trainer", JOB_FILE, "--out", OUT_MOUNT, "--host", BIND_ANY,
            "--preempted-exit-code", str(PREEMPTED_EXIT_CODE)]
    if uses_ranker(job):
        args += ["--ranker", f"{name(j, 'ranker')}:{RANKER_GRPC_PORT}"]
    if trainer.world_size == 1:
        return None, args + ["--admin-port", str(ADMIN_PORT)]
    master = f"{name(j, 'trainer')}-0.{name(j, 'trainer-ranks')}.{namespace}.svc"
    command = ["python", "-m", "torch.distributed.run", "--nnodes", str(trainer.nodes),
               "--nproc-per-node", str(trainer.processes_per_node), "--node-rank", "$(JOB_COMPLETION_INDEX)",
               "--master-addr", master, "--master-port", str(RENDEZVOUS_PORT),
               "--rdzv-conf", f"timeout={trainer.startup.rendezvous_seconds}", "--max-restarts", "0",
               "--shutdown-timeout", str(max(grace_s(job) - LAUNCHER_MARGIN_S, 1)), "--no-python", "streamrl"]
    return command, args


def trainer_startup_s(job: RLJob) -> int:
    """A trainer pod's startup probe time: what precedes its admin server. The model load and
    a checkpoint resume come after it, under their own bounds (trainer.startup)."""
    trainer = job.spec.trainer
    return TRAINER_STARTUP_S if trainer.world_size == 1 else trainer.startup.rendezvous_seconds + RENDEZVOUS_MARGIN_S


def admin_ports(job: RLJob) -> dict[str, int]:
    """A trainer pod's admin ports: `admin` for local rank 0, `admin-rN` for local rank N."""
    return {"admin" if r == 0 else f"admin-r{r}": ADMIN_PORT + r for r in range(job.spec.trainer.processes_per_node)}


TRAINER_AT_NEXT_START = (("trainer", "restartLimit"), ("trainer", "preemptionLimit"), ("trainer", "minGenerators"),
                         ("trainer", "startup"), ("checkpoint", "everyIterations"), ("checkpoint", "keep"))
"""Spec fields an edit of which never replaces a running trainer group: the restart budgets are
the operator's alone, and the trainer reads the others when it starts (its next restart, or
the next replacement, takes the new values from the ConfigMap)."""


def template_hash(job: RLJob) -> str:
    """What replaces a running trainer group when it changes: the config its pods load (less
    TRAINER_AT_NEXT_START) and the user's choices that shape its pods (placement, checkpoint
    volume, image). Never what the operator adds: its default images, pull secrets, probes and
    the like change with an operator upgrade, which must not restart every running group (a
    group started after the upgrade gets them)."""
    loaded = _loaded(job)
    for key in ("pools", "ranker"):  # the trainer's pods read neither (config_hash says why)
        loaded.pop(key)
    for section, key in TRAINER_AT_NEXT_START:
        loaded[section].pop(key, None)
    spec, volume = job.spec, job.spec.checkpoint.volume
    shape = {"placement": spec.trainer.placement.model_dump(mode="json", by_alias=True),
             "volume": volume.model_dump(mode="json", by_alias=True) if volume else None, "image": spec.image}
    return hashlib.sha256(json.dumps({"loaded": loaded, "shape": shape}, sort_keys=True).encode()).hexdigest()[:16]


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
    collector keeps it when the RLJob goes) unless `retain: false`, and marked with the uid of
    the RLJob it is made for (JOB_UID)."""
    volume, j = job.spec.checkpoint.volume, job.metadata.name
    if volume is None or volume.claim_name:
        return None
    mode = volume.access_mode or ("ReadWriteOnce" if job.spec.trainer.nodes == 1 else "ReadWriteMany")
    spec: dict[str, Any] = {"accessModes": [mode], "resources": {"requests": {"storage": volume.size}}}
    if volume.storage_class:
        spec["storageClassName"] = volume.storage_class
    meta = object_meta(name(j, "checkpoints"), namespace, labels(j, "checkpoints"), None if volume.retain else owner)
    if owner is not None:
        meta["annotations"] = {JOB_UID: owner["uid"]}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def hub_cache_claim_name(job: RLJob) -> str | None:
    """The claim the hub cache lives on when there is no checkpoint claim to share (an `hf`
    model): a download outlives the pod an eviction or a restart takes. None otherwise."""
    if job.spec.model.source != "hf" or job.spec.checkpoint.volume is not None:
        return None
    return name(job.metadata.name, "hf-cache")


def build_hub_cache_claim(job: RLJob, namespace: str, owner: dict | None = None) -> dict | None:
    """The hub cache's claim (hub_cache_claim_name): model.hf.cacheSize, ReadWriteMany when
    several trainer pods share it, deleted with the RLJob (a cache, not a result)."""
    claim = hub_cache_claim_name(job)
    if claim is None:
        return None
    hf = job.spec.model.hf
    assert hf is not None  # a claim is named only for a hub model
    mode = "ReadWriteOnce" if job.spec.trainer.nodes == 1 else "ReadWriteMany"
    spec: dict[str, Any] = {"accessModes": [mode], "resources": {"requests": {"storage": hf.cache_size}}}
    if hf.cache_storage_class:
        spec["storageClassName"] = hf.cache_storage_class
    meta = object_meta(claim, namespace, labels(job.metadata.name, "hf-cache"), owner)
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def build_trainer(job: RLJob, namespace: str, settings: Settings, owner: dict | None = None,
                  restarts: int = 0) -> dict:
    """The trainer as an Indexed Job, the way JobSet and the Kubeflow trainer build one:
    parallelism = completions = trainer.nodes, pods named `<job>-trainer-<index>` under the
    headless Service, the run directory on the checkpoint claim when there is one. Any pod
    failing fails the Job (the pod failure policy; the operator then restarts the whole group,
    never half of it: within its budget, or free when the failure was a preemption: exit code
    PREEMPTED_EXIT_CODE first, a disruption next); rank 0 (index 0) finishing completes it.
    Queued through Kueue (queue_name), it is created suspended and Kueue admits the group
    whole; else it is suspended while spec.suspend says so, marked as the operator's own
    suspension (SUSPENDED_BY: the only one it lifts)."""
    j, trainer = job.metadata.name, job.spec.trainer
    if len(f"{name(j, 'trainer')}-{trainer.nodes - 1}") > HOSTNAME_MAX:
        raise SpecError(f"metadata.name: {j!r} is too long for a trainer of {trainer.nodes} nodes: its pods' "
                        f"hostnames <name>-trainer-<index> must fit in {HOSTNAME_MAX} characters")
    command, args = trainer_args(job, namespace)
    ports = {"grpc": TRAINER_GRPC_PORT, **admin_ports(job)}
    if trainer.world_size > 1:
        ports["rendezvous"] = RENDEZVOUS_PORT
    claim = claim_name(job)
    template = pod_template(job, "trainer", trainer.placement, args, ports, settings, device=trainer.device,
                            restart_policy="Never", config_hash=config_hash(job), shm=True,
                            startup_s=trainer_startup_s(job),
                            out_volume={"persistentVolumeClaim": {"claimName": claim}} if claim else None)
    apply_model_parts(template["spec"], model_parts(job, OUT_MOUNT, CACHE_MOUNT, claim is not None, JOB_FILE,
                                                    hub_cache_claim_name(job)), MAIN)
    template["metadata"].setdefault("annotations", {}).update(TRAINER_POD_ANNOTATIONS)
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
        "suspend": True if queue_name(job) else job.spec.suspend,
        "template": template,
    }
    meta = object_meta(name(j, "trainer"), namespace, {**labels(j, "trainer"), **_queued(job)}, owner)
    meta["annotations"] = {TEMPLATE_HASH: template_hash(job), RESTARTS: str(restarts),
                           OPERATOR_VERSION: __version__}
    if spec["suspend"] and not queue_name(job):
        meta["annotations"][SUSPENDED_BY] = "spec.suspend"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


def _rank0(job: str) -> dict[str, str]:
    return {**selector(job, "trainer"), COMPLETION_INDEX: "0"}


def build_trainer_service(job: RLJob, namespace: str, owner: dict | None = None) -> dict:
    """The endpoint generators dial: rank 0's gRPC port alone (the index-0 pod), of the type the
    spec asks (exposed beyond the cluster only with TLS: the spec refuses it otherwise)."""
    j, trainer = job.metadata.name, job.spec.trainer
    meta = object_meta(name(j, "trainer"), namespace, labels(j, "trainer"), owner)
    if trainer.service.annotations:
        meta["annotations"] = dict(trainer.service.annotations)
    spec: dict[str, Any] = {"type": trainer.service_type, "selector": _rank0(j),
                            "ports": [{"name": "grpc", "port": TRAINER_GRPC_PORT, "targetPort": "grpc",
                                       "protocol": "TCP"}]}
    if trainer.service_type == "LoadBalancer":
        # one hop only, and where the balancer passes it through, the client's own address reaches the pod
        spec["externalTrafficPolicy"] = "Local"
        if trainer.service.load_balancer_source_ranges:
            spec["loadBalancerSourceRanges"] = list(trainer.service.load_balancer_source_ranges)
        if trainer.service.load_balancer_class:
            spec["loadBalancerClass"] = trainer.service.load_balancer_class
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def build_trainer_admin_service(job: RLJob, namespace: str, owner: dict | None = None) -> dict:
    """Rank 0's admin port (/status the operator reads), inside the cluster only; published
    before rank 0 is ready, so the operator reads what a trainer not yet running is doing
    (loading the model, resuming, waiting for generators)."""
    j = job.metadata.name
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": object_meta(name(j, "trainer-admin"), namespace, labels(j, "trainer"), owner),
            "spec": {"type": "ClusterIP", "selector": _rank0(j), "publishNotReadyAddresses": True,
                     "ports": [{"name": "admin", "port": ADMIN_PORT, "targetPort": "admin", "protocol": "TCP"}]}}


def build_trainer_ranks_service(job: RLJob, namespace: str, owner: dict | None = None) -> dict:
    """Headless, for the rendezvous: every trainer pod gets a DNS name
    (<job>-trainer-<index>.<job>-trainer-ranks), published before it is ready (ranks meet
    before any of them serves)."""
    j = job.metadata.name
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": object_meta(name(j, "trainer-ranks"), namespace, labels(j, "trainer"), owner),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector(j, "trainer"),
                 "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT,
                            "protocol": "TCP"}]},
    }


# ---- the ranker and the generators --------------------------------------------------
def _deployment(job: RLJob, namespace: str, role: str, replicas: int, template: dict, owner: dict | None,
                pool: str | None = None, finished: bool = False, held: bool = False) -> dict:
    j = job.metadata.name
    stopped = job.spec.suspend or finished or held
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": object_meta(name(j, role if role != "generator" else "gen", pool), namespace,
                                {**labels(j, role, pool), **_queued(job)}, owner),
        "spec": {"replicas": 0 if stopped else replicas, "selector": {"matchLabels": selector(j, role, pool)},
                 # one pod at a time, without a surge pod that a full GPU pool could never place
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                 "template": template},
    }


def build_ranker(job: RLJob, namespace: str, settings: Settings, owner: dict | None = None,
                 finished: bool = False, held: bool = False) -> list[dict]:
    """The ranker's Deployment and Service (its state in the pod; a restart relearns from history)."""
    j, ranker = job.metadata.name, job.spec.ranker
    args = ["ranker", JOB_FILE, "--host", BIND_ANY, "--admin-port", str(ADMIN_PORT),
            "--state", f"{OUT_MOUNT}/ranker.npz"]
    placement = ranker.placement if ranker.placement.resources else ranker.placement.model_copy(
        update={"resources": RANKER_RESOURCES})
    template = pod_template(job, "ranker", placement, args, {"grpc": RANKER_GRPC_PORT, "admin": ADMIN_PORT},
                            settings, device=ranker.device if ranker.predictor == "causal-lm" else "cpu",
                            config_hash=config_hash(job, "ranker"), extra_labels=_queued(job))
    deployment = _deployment(job, namespace, "ranker", 1, template, owner, finished=finished, held=held)
    deployment["spec"]["strategy"] = {"type": "Recreate"}
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": object_meta(name(j, "ranker"), namespace, labels(j, "ranker"), owner),
        "spec": {"selector": selector(j, "ranker"),
                 "ports": [{"name": "grpc", "port": RANKER_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"}]},
    }
    return [deployment, service]


def build_generators(job: RLJob, pool_name: str, namespace: str, settings: Settings, trainer_address: str,
                     owner: dict | None = None, origin: dict[str, str] | None = None,
                     finished: bool = False, held: bool = False) -> dict:
    """One pool's Deployment. `trainer_address` is host:port of the trainer's Service (in
    another cluster: its external address); `origin` labels mark objects made for a job in
    another cluster; `finished`: the job is over, `held`: its trainer Job waits for
    admission; either way the pool is scaled to 0."""
    pools = {p.name: p for p in job.spec.generators.pools}
    pool = pools[pool_name]
    replicas = job.spec.generators.pool_replicas()[pool_name]
    args = ["generator", JOB_FILE, "--trainer", trainer_address, "--pool", pool_name, "--id", "$(POD_NAME)",
            "--host", BIND_ANY, "--admin-port", str(ADMIN_PORT), "--relay-port", str(RELAY_PORT),
            "--advertise-host", "$(POD_IP)"]
    template = pod_template(job, "generator", pool.placement, args, {"relay": RELAY_PORT, "admin": ADMIN_PORT},
                            settings, device=pool.engine.device, pool=pool_name,
                            config_hash=config_hash(job, "generator", pool_name),
                            shm=True, extra_labels={**_queued(job), **(origin or {})})
    deployment = _deployment(job, namespace, "generator", replicas, template, owner, pool_name, finished, held)
    if origin:
        deployment["metadata"]["labels"].update(origin)
    return deployment


def build_children(job: RLJob, namespace: str, settings: Settings, owner: dict | None = None,
                   token: str | None = None, finished: bool = False, held: bool | None = None) -> list[dict]:
    """Every object in the RLJob's own cluster (pools with a clusterRef are built apart).
    `token`: the job's token (perimeter.job_token) when the operator mints it; `finished`:
    the job is Succeeded or Failed, `held`: its trainer Job waits for admission, its
    Deployments at 0 replicas either way (None: held when the job names a Kueue queue, as
    before its trainer Job is admitted: what a render shows)."""
    j = job.metadata.name
    held = queue_name(job) is not None if held is None else held
    check_devices(job)
    trainer_address = f"{name(j, 'trainer')}.{namespace}.svc:{TRAINER_GRPC_PORT}"
    claim = build_checkpoint_claim(job, namespace, owner)
    out = [build_configmap(job, namespace, owner)]
    if minted_token(job):
        if token is None:
            raise ValueError("the job's token is minted by the operator: pass it (perimeter.job_token)")
        out.append(build_token_secret(job, namespace, token, owner))
    if settings.network_policy:
        out += build_network_policies(job, namespace, settings, owner, operator_namespace=settings.namespace)
    out += [c for c in (claim, build_hub_cache_claim(job, namespace, owner)) if c]
    out += [build_trainer(job, namespace, settings, owner),
            build_trainer_service(job, namespace, owner), build_trainer_admin_service(job, namespace, owner),
            build_trainer_ranks_service(job, namespace, owner)]
    if uses_ranker(job):
        out += build_ranker(job, namespace, settings, owner, finished, held)
    for pool in job.spec.generators.pools:
        if not pool.cluster_ref:
            out.append(build_generators(job, pool.name, namespace, settings, trainer_address, owner,
                                        finished=finished, held=held))
    return out

