"""Pod templates of every role, secure by default: what passes Pod Security "restricted"
(non-root, RuntimeDefault seccomp, no capabilities, read-only root with writable emptyDirs),
no service-account token, `/dev/shm` in memory, the job's spec and token mounted as files,
the image for the role's device, and the user's template merged under the operator's part.
Pure: no I/O."""

from __future__ import annotations

import copy
from typing import Any

from streamrl.operator.names import CONFIG_HASH, MAIN, labels, name
from streamrl.operator.settings import Settings
from streamrl.spec import TLS_MOUNT, TOKEN_MOUNT, RLJob, SpecError

SPEC_MOUNT, OUT_MOUNT, CACHE_MOUNT = "/etc/streamrl/job", "/var/lib/streamrl/out", "/var/cache/streamrl"
TMP_MOUNT = "/tmp"
"""A writable emptyDir (and HOME): the root filesystem is read-only."""
JOB_FILE = f"{SPEC_MOUNT}/job.yaml"
RUN_AS = 10001
"""The images' user and group (docker/Dockerfile*)."""
SHM_GPU, SHM_CPU = "16Gi", "512Mi"
"""Size limits of the in-memory /dev/shm of a pod with GPUs (NCCL's intra-node transport, a
tensor-parallel engine) and without; counted against the pod's memory."""
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}
"""Pod Security "restricted"; a claim's files are re-owned only when its root is not the group's
(a checkpoint volume is not walked at every start)."""
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


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


def quantity(value: Any) -> Any:
    """A resource quantity as the API server stores it, a string (8 -> "8"): numbers and strings
    of the same amount would otherwise read as a difference."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def resources(placement) -> dict:
    """The main container's requests and limits, the placement's GPUs added, quantities as strings."""
    res = {kind: {k: quantity(v) for k, v in (values or {}).items()}
           for kind, values in (placement.resources or {}).items()}
    if placement.gpus:
        for kind in ("requests", "limits"):
            res.setdefault(kind, {})[placement.gpu_resource] = str(placement.gpus)
    return res


def image(job: RLJob, device: str, settings: Settings) -> str:
    """spec.image, else the CUDA image for a role on a CUDA device, else the CPU image."""
    if job.spec.image:
        return job.spec.image
    return settings.cuda_image if device.startswith("cuda") else settings.image


def check_devices(job: RLJob) -> None:
    """On Kubernetes a role on a CUDA device must ask for GPUs: a pod gets only those its
    placement requests (locally, placement is ignored and the machine's GPUs are used).
    SpecError naming the field."""
    roles = [("spec.trainer", job.spec.trainer.device, job.spec.trainer.placement)]
    if job.spec.ranker.predictor == "causal-lm":
        roles.append(("spec.ranker", job.spec.ranker.device, job.spec.ranker.placement))
    roles += [(f"spec.generators.pools[{i}]", p.engine.device, p.placement) for i, p in
              enumerate(job.spec.generators.pools)]
    for where, device, placement in roles:
        if device.startswith("cuda") and not placement.gpus:
            raise SpecError(f"{where}.placement.gpus: 0, but the role runs on {device}: on Kubernetes a pod sees only "
                            "the GPUs its placement asks for (set placement.gpus)")


def minted_token(job: RLJob) -> bool:
    """Whether the operator mints the job's token (the spec names no token file of its own)."""
    return job.spec.security.token_file is None


STARTUP_PROBE_PERIOD_S = 5
STARTUP_S = 600
"""Seconds a container has from its start to serve /healthz, unless its role says otherwise
(every service starts its admin server before it loads anything)."""


def pod_template(job: RLJob, role: str, placement, args: list[str], ports: dict[str, int], settings: Settings,
                 device: str = "cpu", pool: str | None = None, env: list[dict] | None = None,
                 restart_policy: str | None = None, out_volume: dict | None = None, config_hash: str = "",
                 shm: bool = False, extra_labels: dict[str, str] | None = None, startup_s: int = STARTUP_S) -> dict:
    """The pod template of one role: the operator's part, with the user's template merged
    under it (the operator's fields win, the user's extra ones are kept). `out_volume`: the
    source of the run directory (default: the pod's own disk); `config_hash`: of the spec the
    pod loads (a change rolls the pods); `shm`: an in-memory /dev/shm; `startup_s`: the
    startup probe's time, from the container's start to its first /healthz."""
    spec, j = job.spec, job.metadata.name
    volumes = [
        {"name": "job", "configMap": {"name": name(j, "spec")}},
        {"name": "out", **(out_volume or {"emptyDir": {}})},
        {"name": "cache", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts = [
        {"name": "job", "mountPath": SPEC_MOUNT, "readOnly": True},
        {"name": "out", "mountPath": OUT_MOUNT},
        {"name": "cache", "mountPath": CACHE_MOUNT},
        {"name": "tmp", "mountPath": TMP_MOUNT},
    ]
    if shm:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory",
                                                     "sizeLimit": SHM_GPU if placement.gpus else SHM_CPU}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if minted_token(job):
        volumes.append({"name": "token", "secret": {"secretName": name(j, "token"), "defaultMode": 0o440}})
        mounts.append({"name": "token", "mountPath": TOKEN_MOUNT, "readOnly": True})
    tls = spec.security.tls
    secret = tls and ((role == "generator" and tls.generator_secret_name) or tls.secret_name)
    if secret:
        volumes.append({"name": "tls", "secret": {"secretName": secret, "defaultMode": 0o440}})
        mounts.append({"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True})
    probe = {"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 10, "failureThreshold": 6}
    container = {
        "name": MAIN,
        "image": image(job, device, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "args": args,
        "env": [
            {"name": "STREAMRL_CACHE_DIR", "value": CACHE_MOUNT},
            {"name": "HOME", "value": TMP_MOUNT},  # the root filesystem is read-only
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            # MKL reads its default once, at start: only the compute thread (streamrl.compute) runs
            # its products on the process's threads
            {"name": "MKL_NUM_THREADS", "value": "1"},
            # no GPU asked for, none seen, even where the node's default runtime is NVIDIA's
            *([] if placement.gpus else [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]),
            *(env or []),
        ],
        "ports": [{"name": k, "containerPort": v, "protocol": "TCP"} for k, v in ports.items()],
        "volumeMounts": mounts,
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": STARTUP_PROBE_PERIOD_S,
                         "failureThreshold": -(-startup_s // STARTUP_PROBE_PERIOD_S)},
        "livenessProbe": probe,
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "admin"}, "periodSeconds": 5},
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
    }
    res = resources(placement)
    if res:
        container["resources"] = res
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "securityContext": copy.deepcopy(POD_SECURITY),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    if placement.node_selector:
        pod_spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(placement.tolerations)
    if restart_policy:
        pod_spec["restartPolicy"] = restart_policy
    metadata: dict[str, Any] = {"labels": {**labels(j, role, pool), **(extra_labels or {})}}
    if config_hash:
        metadata["annotations"] = {CONFIG_HASH: config_hash}
    user = copy.deepcopy(placement.template or {})
    if "automountServiceAccountToken" in (user.get("spec") or {}):
        del pod_spec["automountServiceAccountToken"]  # a pod that needs its token (workload identity) says so
    ours = {"metadata": metadata, "spec": pod_spec}
    return merge(user, ours) if user else ours
