"""Where the trainer's pods find the policy model (spec.model.source) and a `jsonl` task's file
(spec.task.hf, spec.task.pvc), as pod parts: volumes, mounts, an init container, environment
and the trainer's `--model-dir`. Only trainer pods get them: generators boot from the trainer
and mount no model. Pure: no I/O.

- `hf` (model or task file): an init container (`streamrl fetch`) downloads it once into the
  Hugging Face cache on a claim: the checkpoint claim, else for a model the claim the
  operator makes for the cache (<job>-hf-cache), so an evicted or restarted pod finds the
  download there (a task file alone goes to the pod's cache emptyDir); the trainer then
  reads that cache offline. A token Secret is mounted as a file, for these two
  containers only (HF_TOKEN_PATH), never an environment variable.
- task `pvc`: the claim, read-only; the spec the pods load names the file's path in it.
- `pvc`: the claim, read-only.
- `image`: an image volume (Kubernetes 1.31+ with the ImageVolume feature; on by default from
  1.35), or with `mount: copy` an init container running the model image copies it into an
  emptyDir."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from streamrl.spec import RLJob, SpecError

MODEL_MOUNT = "/var/lib/streamrl/model"
DATA_MOUNT = "/var/lib/streamrl/data"
HF_TOKEN_MOUNT = "/var/run/secrets/streamrl/hf"
HF_CACHE_MOUNT = "/var/lib/streamrl/hf-cache"
"""Where the hub cache's own claim is mounted (a job without a checkpoint claim)."""
FETCH_CONTAINER, COPY_CONTAINER = "fetch", "model-copy"
"""The init containers that download from the hub (`streamrl fetch`) and copy a model image out."""


@dataclass
class ModelParts:
    volumes: list[dict] = field(default_factory=list)
    mounts: list[dict] = field(default_factory=list)
    """Of the trainer's container (and of the init container, which mounts them too)."""
    env: list[dict] = field(default_factory=list)
    init_containers: list[dict] = field(default_factory=list)
    """Without their image (unless they name one), mounts, env and security context:
    apply_model_parts completes them."""
    model_dir: str | None = None
    """The trainer's --model-dir (None: it resolves the spec's source itself)."""
    from_hub: bool = False
    """The fetch init container fills the Hugging Face cache: the trainer then reads it offline."""


def _inside(root: str, sub: str) -> str:
    return str(PurePosixPath(root) / sub) if sub else root


def hub_token_secret(job: RLJob) -> str | None:
    """The one Secret holding the job's hub token (model.hf and task.hf may both name it);
    SpecError when they name two."""
    model, task = job.spec.model, job.spec.task
    names = {s for s in (model.hf.token_secret if model.hf else None, task.hf.token_secret if task.hf else None) if s}
    if len(names) > 1:
        raise SpecError(f"spec.task.hf.tokenSecret: {' and '.join(sorted(names))}: the trainer's pods mount one hub "
                        "token; name the same Secret in model.hf and task.hf")
    return names.pop() if names else None


def task_path(job: RLJob) -> str | None:
    """The task file's path in the trainer's pods when it is on a claim (the spec they load says it)."""
    pvc = job.spec.task.pvc
    return _inside(DATA_MOUNT, pvc.path) if pvc else None


def model_parts(job: RLJob, out_mount: str, cache_mount: str, on_claim: bool, job_file: str,
                cache_claim: str | None = None) -> ModelParts:
    """The pod parts for the job's model source and task file (empty for a built-in model and
    task: built in the pod; a path is the user's to mount through the pod template).
    `on_claim`: the run directory is on the checkpoint claim; `cache_claim`: the hub cache's
    own claim (builders.hub_cache_claim_name)."""
    model, task = job.spec.model, job.spec.task
    parts = ModelParts()
    if model.source == "hf" or task.hf:
        if on_claim:
            cache = f"{out_mount}/hf-cache"
        elif cache_claim:
            cache = HF_CACHE_MOUNT
            parts.volumes.append({"name": "hf-cache", "persistentVolumeClaim": {"claimName": cache_claim}})
            parts.mounts.append({"name": "hf-cache", "mountPath": HF_CACHE_MOUNT})
        else:
            cache = f"{cache_mount}/hf"
        parts.env.append({"name": "HF_HUB_CACHE", "value": cache})
        if (token := hub_token_secret(job)) is not None:
            secret = {"secretName": token, "defaultMode": 0o440, "items": [{"key": "token", "path": "token"}]}
            parts.volumes.append({"name": "hf-token", "secret": secret})
            parts.mounts.append({"name": "hf-token", "mountPath": HF_TOKEN_MOUNT, "readOnly": True})
            parts.env.append({"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_MOUNT}/token"})
        parts.init_containers.append({"name": FETCH_CONTAINER, "args": ["fetch", job_file]})
        parts.from_hub = True
    if task.pvc:
        parts.volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": task.pvc.claim_name,
                                                                         "readOnly": True}})
        parts.mounts.append({"name": "data", "mountPath": DATA_MOUNT, "readOnly": True})
    if model.source == "pvc":
        assert model.pvc is not None  # the spec requires it with this source
        parts.volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": model.pvc.claim_name,
                                                                          "readOnly": True}})
        parts.mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
        parts.model_dir = _inside(MODEL_MOUNT, model.pvc.sub_path)
    elif model.source == "image":
        source = model.image
        assert source is not None  # the spec requires it with this source
        if source.mount == "volume":
            parts.volumes.append({"name": "model", "image": {"reference": source.reference,
                                                             "pullPolicy": "IfNotPresent"}})
            parts.mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
            parts.model_dir = _inside(MODEL_MOUNT, source.path)
        else:
            parts.volumes.append({"name": "model", "emptyDir": {}})
            parts.mounts.append({"name": "model", "mountPath": MODEL_MOUNT})
            copy_out = ["cp", "-R", f"{_inside('/', source.path).rstrip('/')}/.", MODEL_MOUNT]
            parts.init_containers.insert(0, {"name": COPY_CONTAINER, "image": source.reference, "command": copy_out})
            parts.model_dir = MODEL_MOUNT
    return parts


def apply_model_parts(pod_spec: dict, parts: ModelParts, main: str) -> None:
    """Add the parts to a built trainer pod spec: the init container runs with the main
    container's image, security context, mounts and environment unless it says otherwise."""
    container = next(c for c in pod_spec["containers"] if c["name"] == main)
    pod_spec["volumes"] = [*pod_spec["volumes"], *copy.deepcopy(parts.volumes)]
    container["volumeMounts"] = [*container["volumeMounts"], *copy.deepcopy(parts.mounts)]
    container["env"] = [*container["env"], *copy.deepcopy(parts.env)]
    if parts.model_dir:
        container["args"] = [*container["args"], "--model-dir", parts.model_dir]
    plain = {kind: {k: v for k, v in values.items() if k in ("cpu", "memory", "ephemeral-storage")}
             for kind, values in (container.get("resources") or {}).items()}
    for part in parts.init_containers:
        init = {"image": container["image"], "imagePullPolicy": container.get("imagePullPolicy", "IfNotPresent"),
                **copy.deepcopy(part),
                "env": copy.deepcopy(container["env"]), "volumeMounts": copy.deepcopy(container["volumeMounts"]),
                "securityContext": copy.deepcopy(container["securityContext"]),
                # its last lines become the pod's message when it fails (a repository that does not exist)
                "terminationMessagePolicy": "FallbackToLogsOnError"}
        if any(plain.values()):  # the pod's CPU and memory (its GPUs are the trainer's alone)
            init["resources"] = {kind: values for kind, values in plain.items() if values}
        pod_spec["initContainers"] = [*pod_spec.get("initContainers", []), init]
    if parts.from_hub:  # the init container filled the cache: the trainer reads it, and never the hub
        container["env"].append({"name": "HF_HUB_OFFLINE", "value": "1"})
