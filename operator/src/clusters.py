"""RLCluster: another Kubernetes cluster generator pools can run in. Its typed spec (the
CRD's schema is generated from it), and registration: the kubeconfig Secret read and
checked, the cluster probed, the outcome as the RLCluster's status. Knows no RLJob."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import httpx
import yaml
from pydantic import Field, ValidationError

from streamrl.operator.kube import KubeClient, KubeError, kubeconfig_problems, path_of
from streamrl.spec import SpecModel

if TYPE_CHECKING:
    from streamrl.operator.runtime import Runtime


class ClusterPhase(StrEnum):
    """Whether pools can be placed in the cluster (status.phase)."""

    ACTIVE = "Active"
    INACTIVE = "Inactive"


class SecretKeyRef(SpecModel):
    """A key of a Secret in the operator's namespace."""

    name: str = Field(max_length=253)
    """The Secret's name."""
    key: str = Field("kubeconfig", max_length=253)
    """The key of its data holding the kubeconfig."""


class RLClusterSpec(SpecModel):
    """How to reach the cluster."""

    kubeconfig_secret_ref: SecretKeyRef
    """The Secret, in the operator's namespace, holding a self-contained kubeconfig (no exec
    plugins, auth providers, file paths or insecure TLS)."""


def parse_cluster_spec(spec: object) -> RLClusterSpec:
    """The typed spec; ValueError naming each bad field (spec.kubeconfigSecretRef.name: ...)."""
    try:
        return RLClusterSpec.model_validate(spec if spec is not None else {})
    except ValidationError as err:
        problems = []
        for e in err.errors():
            where = ".".join(["spec", *(str(p) for p in e["loc"])])
            problems.append(f"{where}: {'unknown field' if e['type'] == 'extra_forbidden' else e['msg']}")
        raise ValueError("; ".join(problems)) from None


@dataclass(frozen=True)
class Registration:
    """What checking one RLCluster found."""

    problems: tuple[str, ...] = ()
    """Why it cannot be used; empty = Active."""
    reason: str = "Reachable"
    """The Active condition's reason: Reachable, InvalidSpec, SecretMissing or InvalidKubeconfig."""
    version: str = ""
    """The cluster's Kubernetes version, once reached."""

    @property
    def phase(self) -> ClusterPhase:
        return ClusterPhase.INACTIVE if self.problems else ClusterPhase.ACTIVE

    def status(self, now: str) -> dict:
        active = self.phase == ClusterPhase.ACTIVE
        message = "; ".join(self.problems)
        return {"phase": self.phase.value, "message": message or f"reachable, Kubernetes {self.version}",
                "conditions": [{"type": "Active", "status": "True" if active else "False", "reason": self.reason,
                                "message": message, "lastTransitionTime": now}]}


async def register(runtime: Runtime, cluster: str, raw_spec: object) -> Registration:
    """Check an RLCluster and, when usable, keep its client in runtime.clusters (else forget it)."""
    result = await _check(runtime, cluster, raw_spec)
    if result.problems:
        runtime.clusters.pop(cluster, None)
    return result


async def _check(runtime: Runtime, cluster: str, raw_spec: object) -> Registration:
    try:
        ref = parse_cluster_spec(raw_spec).kubeconfig_secret_ref
    except ValueError as err:
        return Registration((str(err),), "InvalidSpec")
    namespace = runtime.settings.namespace
    secret = await runtime.kube.get(path_of("v1", "Secret", namespace, ref.name))
    if secret is None:
        return Registration((f"Secret {namespace}/{ref.name} not found",), "SecretMissing")
    raw = (secret.get("data") or {}).get(ref.key)
    if raw is None:
        return Registration((f"Secret {ref.name} has no key {ref.key!r}",), "InvalidKubeconfig")
    try:
        config = yaml.safe_load(base64.b64decode(raw))
    except (ValueError, yaml.YAMLError) as err:
        return Registration((f"kubeconfig is not YAML: {err}",), "InvalidKubeconfig")
    problems = kubeconfig_problems(config)
    if problems:
        return Registration(tuple(problems), "InvalidKubeconfig")
    client = KubeClient.from_kubeconfig(config, cluster)
    try:
        version = (await client.version()).get("gitVersion", "")
    except (KubeError, httpx.HTTPError) as err:
        await client.close()
        return Registration((f"cannot reach {client.server}: {err}",), "InvalidKubeconfig")
    runtime.clusters[cluster] = client
    return Registration(version=version)
