"""Where the trainer's pods find the policy model (spec.model.source), as pod parts: volumes,
mounts, an init container, environment and the trainer's `--model-dir`. Only trainer pods get
them: generators boot from the trainer and mount no model. Pure: no I/O.

- `hf`: an init container (`streamrl fetch-model`) downloads the repository once into the
  Hugging Face cache on the checkpoint claim (the pod's cache emptyDir without one); the
  trainer then reads that cache offline. A token Secret is mounted as a file, for these two
  containers only (HF_TOKEN_PATH), never an environment variable.
- `pvc`: the claim, read-only.
- `image`: an image volume (Kubernetes 1.31+ with the ImageVolume feature; on by default from
  1.35), or with `mount: copy` an init container running the model image copies it into an
  emptyDir."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from streamrl.spec import RLJob

MODEL_MOUNT = "/var/lib/streamrl/model"
HF_TOKEN_MOUNT = "/var/run/secrets/streamrl/hf"
FETCH_CONTAINER = "model"
"""The init container that puts the model in place (hf download, image copy)."""


@dataclass
class ModelParts:
    volumes: list[dict] = field(default_factory=list)
    mounts: list[dict] = field(default_factory=list)
    """Of the trainer's container (and of the init container, which mounts them too)."""
    env: list[dict] = field(default_factory=list)
    init_container: dict | None = None
    """Without its image, mounts, env and security context: the pod builder completes it."""
    model_dir: str | None = None
    """The trainer's --model-dir (None: it resolves the spec's source itself)."""


def _inside(root: str, sub: str) -> str:
    return str(PurePosixPath(root) / sub) if sub else root


def model_parts(job: RLJob, out_mount: str, cache_mount: str, on_claim: bool, job_file: str) -> ModelParts:
    """The pod parts for the job's model source (empty for builtin-tiny and path: the built-in
    model is built in the pod, a path is the user's to mount through the pod template)."""
    model = job.spec.model
    parts = ModelParts()
    if model.source == "hf":
        cache = f"{out_mount}/hf-cache" if on_claim else f"{cache_mount}/hf"
        parts.env.append({"name": "HF_HUB_CACHE", "value": cache})
        if model.hf.token_secret:
            secret = {"secretName": model.hf.token_secret, "defaultMode": 0o440,
                      "items": [{"key": "token", "path": "token"}]}
            parts.volumes.append({"name": "hf-token", "secret": secret})
            parts.mounts.append({"name": "hf-token", "mountPath": HF_TOKEN_MOUNT, "readOnly": True})
            parts.env.append({"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_MOUNT}/token"})
        parts.init_container = {"name": FETCH_CONTAINER, "args": ["fetch-model", job_file]}
    elif model.source == "pvc":
        parts.volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": model.pvc.claim_name,
                                                                          "readOnly": True}})
        parts.mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
        parts.model_dir = _inside(MODEL_MOUNT, model.pvc.sub_path)
    elif model.source == "image":
        source = model.image
        if source.mount == "volume":
            parts.volumes.append({"name": "model", "image": {"reference": source.reference,
                                                             "pullPolicy": "IfNotPresent"}})
            parts.mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
            parts.model_dir = _inside(MODEL_MOUNT, source.path)
        else:
            parts.volumes.append({"name": "model", "emptyDir": {}})
            parts.mounts.append({"name": "model", "mountPath": MODEL_MOUNT})
            parts.init_container = {"name": FETCH_CONTAINER, "image": source.reference,
                                    "command": ["cp", "-R", f"{_inside('/', source.path).rstrip('/')}/.", MODEL_MOUNT]}
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
    if parts.init_container is None:
        return
    init = {"image": container["image"], "imagePullPolicy": container.get("imagePullPolicy", "IfNotPresent"),
            **copy.deepcopy(parts.init_container),
            "env": copy.deepcopy(container["env"]), "volumeMounts": copy.deepcopy(container["volumeMounts"]),
            "securityContext": copy.deepcopy(container["securityContext"]),
            # its last lines become the pod's message when it fails (a repository that does not exist)
            "terminationMessagePolicy": "FallbackToLogsOnError"}
    plain = {kind: {k: v for k, v in values.items() if k in ("cpu", "memory", "ephemeral-storage")}
             for kind, values in (container.get("resources") or {}).items()}
    if any(plain.values()):  # the pod's CPU and memory (its GPUs are the trainer's alone)
        init["resources"] = {kind: values for kind, values in plain.items() if values}
    pod_spec["initContainers"] = [*pod_spec.get("initContainers", []), init]
    if parts.env and any(e["name"] == "HF_HUB_CACHE" for e in parts.env):
        # the init container filled the cache: the trainer reads it, and never the hub
        container["env"].append({"name": "HF_HUB_OFFLINE", "value": "1"})
