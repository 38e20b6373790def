"""RLCluster: another Kubernetes cluster generator pools can run in. Its typed spec (the
CRD's schema is generated from it), and registration: the kubeconfig Secret read and
checked, the cluster probed (reachable, and its user allowed what the operator does there:
SelfSubjectAccessReviews, in each allowed namespace), the outcome as the RLCluster's status.
Probed again on a timer, so a cluster whose network or token died turns Inactive. Knows no
RLJob."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import httpx
import yaml
from pydantic import Field, ValidationError, field_validator

from streamrl.operator.kube import KubeClient, KubeError, kubeconfig_problems, path_of
from streamrl.spec import SpecModel

if TYPE_CHECKING:
    from streamrl.operator.runtime import Runtime


REVIEW_S = 600.0
"""How often a kept cluster client's permissions are checked again (SelfSubjectAccessReviews,
18 per allowed namespace); its reachability is probed every time."""
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ClusterPhase(StrEnum):
    """Whether pools can be placed in the cluster (status.phase)."""

    ACTIVE = "Active"
    INACTIVE = "Inactive"


class SecretKeyRef(SpecModel):
    """A key of a Secret in the operator's namespace."""

    name: str = Field(max_length=253)
    """The Secret's name."""
    key: str = Field(default="kubeconfig", max_length=253)
    """The key of its data holding the kubeconfig."""


NEEDED = (("apps", "deployments", ("get", "list", "create", "patch", "delete")),
          ("", "configmaps", ("get", "list", "create", "patch", "delete")),
          ("", "secrets", ("get", "create", "patch", "delete")),
          ("networking.k8s.io", "networkpolicies", ("get", "list", "create", "patch", "delete")))
"""What the operator does in a remote cluster, per (group, resource): a pool's Deployment, the
job's spec and token, its NetworkPolicy."""


class RLClusterSpec(SpecModel):
    """How to reach the cluster, and which namespaces' RLJobs may place pools there."""

    kubeconfig_secret_ref: SecretKeyRef
    """The Secret, in the operator's namespace, holding a self-contained kubeconfig (no exec
    plugins, auth providers, file paths or insecure TLS)."""
    allowed_namespaces: list[str] = Field(min_length=1, max_length=256)
    """Namespaces whose RLJobs may place pools in this cluster (in the namespace of the same
    name there); `["*"]`: any. Anyone who may create an RLJob in such a namespace runs pods
    there under this kubeconfig's identity."""

    @field_validator("allowed_namespaces")
    @classmethod
    def _namespaces(cls, value: list[str]) -> list[str]:
        bad = [n for n in value if n != "*" and not DNS_LABEL.match(n)]
        if bad:
            raise ValueError(f"{', '.join(map(repr, bad))}: a namespace name (DNS-1123 label) or \"*\"")
        return value


def parse_cluster_spec(spec: object) -> RLClusterSpec:
    """The typed spec; ValueError naming each bad field (spec.kubeconfigSecretRef.name: ...)."""
    try:
        return RLClusterSpec.model_validate(spec if spec is not None else {})
    except ValidationError as err:
        problems = []
        for e in err.errors():
            where = ".".join(["spec", *(str(p) for p in e["loc"])])
            message = "unknown field" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {message}")
        raise ValueError("; ".join(problems)) from None


@dataclass(frozen=True)
class Registration:
    """What checking one RLCluster found."""

    problems: tuple[str, ...] = ()
    """Why it cannot be used; empty = Active."""
    reason: str = "Reachable"
    """The Active condition's reason: Reachable, InvalidSpec, SecretMissing, InvalidKubeconfig,
    Unreachable or Forbidden."""
    version: str = ""
    """The cluster's Kubernetes version, once reached."""

    @property
    def phase(self) -> ClusterPhase:
        return ClusterPhase.INACTIVE if self.problems else ClusterPhase.ACTIVE

    def status(self, now: str, previous: dict | None = None) -> dict:
        """The RLCluster's status; the Active condition keeps its transition time while its status holds."""
        active = self.phase == ClusterPhase.ACTIVE
        message = "; ".join(self.problems)
        old = next((c for c in (previous or {}).get("conditions") or [] if c.get("type") == "Active"), {})
        status = "True" if active else "False"
        since = old.get("lastTransitionTime") if old.get("status") == status and old.get("lastTransitionTime") else now
        return {"phase": self.phase.value, "message": message or f"reachable, Kubernetes {self.version}",
                "conditions": [{"type": "Active", "status": status, "reason": self.reason,
                                "message": message, "lastTransitionTime": since}]}


async def register(runtime: Runtime, cluster: str, raw_spec: object) -> Registration:
    """Check an RLCluster and, when usable, keep its client in runtime.clusters: the same one
    while its kubeconfig is unchanged; a replaced one is closed once the requests in flight on
    it had time to finish (a reconcile may be using it). Else forget it."""
    result, client, allowed = await _check(runtime, cluster, raw_spec)
    old = runtime.clusters.pop(cluster, None)
    if old is not None and old is not client:
        _retire(runtime, old)
    if client is not None:
        runtime.clusters[cluster] = client
        runtime.allowed_namespaces[cluster] = allowed
    else:
        runtime.allowed_namespaces.pop(cluster, None)
        runtime.cluster_digests.pop(cluster, None)
        runtime.cluster_reviewed.pop(cluster, None)
    return result


def _retire(runtime: Runtime, client: KubeClient) -> None:
    """Close `client` after runtime.client_grace_s, leaving requests in flight on it to finish."""
    async def close_later() -> None:
        await asyncio.sleep(runtime.client_grace_s)
        await client.close()

    task = asyncio.ensure_future(close_later())
    runtime.retiring.add(task)
    task.add_done_callback(runtime.retiring.discard)


async def forget(runtime: Runtime, cluster: str) -> None:
    """The RLCluster is gone: drop its client (closed after the grace)."""
    runtime.allowed_namespaces.pop(cluster, None)
    runtime.cluster_digests.pop(cluster, None)
    runtime.cluster_reviewed.pop(cluster, None)
    client = runtime.clusters.pop(cluster, None)
    if client is not None:
        _retire(runtime, client)


async def missing_permissions(client: KubeClient, namespaces: list[str]) -> list[str]:
    """"verb resource in namespace" for each action the operator needs there that the
    kubeconfig's user may not do (SelfSubjectAccessReview; "*" checks every namespace)."""
    missing = []
    for namespace in namespaces:
        where = "every namespace" if namespace == "*" else f"namespace {namespace}"
        for group, resource, verbs in NEEDED:
            for verb in verbs:
                attributes = {"verb": verb, "group": group, "resource": resource,
                              **({} if namespace == "*" else {"namespace": namespace})}
                review = await client.create({"apiVersion": "authorization.k8s.io/v1",
                                              "kind": "SelfSubjectAccessReview", "metadata": {"name": ""},
                                              "spec": {"resourceAttributes": attributes}})
                if not (review.get("status") or {}).get("allowed"):
                    missing.append(f"{verb} {resource} in {where}")
    return missing


async def _check(runtime: Runtime, cluster: str,
                 raw_spec: object) -> tuple[Registration, KubeClient | None, tuple[str, ...]]:
    """(what was found, the client when the cluster is usable, its allowed namespaces)."""
    try:
        spec = parse_cluster_spec(raw_spec)
    except ValueError as err:
        return Registration((str(err),), "InvalidSpec"), None, ()
    ref, namespace = spec.kubeconfig_secret_ref, runtime.settings.namespace
    secret = await runtime.kube.get(path_of("v1", "Secret", namespace, ref.name))
    if secret is None:
        return Registration((f"Secret {namespace}/{ref.name} not found",), "SecretMissing"), None, ()
    raw = (secret.get("data") or {}).get(ref.key)
    if raw is None:
        return Registration((f"Secret {ref.name} has no key {ref.key!r}",), "InvalidKubeconfig"), None, ()
    try:
        config = yaml.safe_load(base64.b64decode(raw))
    except (ValueError, yaml.YAMLError) as err:
        return Registration((f"kubeconfig is not YAML: {err}",), "InvalidKubeconfig"), None, ()
    problems = kubeconfig_problems(config)
    if problems:
        return Registration(tuple(problems), "InvalidKubeconfig"), None, ()
    digest = hashlib.sha256(raw.encode() + json.dumps(spec.allowed_namespaces).encode()).hexdigest()
    kept = runtime.clusters.get(cluster) if runtime.cluster_digests.get(cluster) == digest else None
    try:
        client = kept or KubeClient.from_kubeconfig(config, cluster)
    except (ValueError, OSError) as err:  # an unreadable CA or client certificate
        return Registration((f"kubeconfig: {err}",), "InvalidKubeconfig"), None, ()
    now = time.monotonic()
    review = kept is None or now - runtime.cluster_reviewed.get(cluster, -REVIEW_S) >= REVIEW_S
    try:
        version = (await client.version()).get("gitVersion", "")
        missing = await missing_permissions(client, spec.allowed_namespaces) if review else []
    except (KubeError, httpx.HTTPError) as err:
        if client is not kept:
            await client.close()
        return Registration((f"cannot reach {client.server}: {err}",), "Unreachable"), None, ()
    if missing:
        if client is not kept:
            await client.close()
        return Registration((f"the kubeconfig's user may not: {', '.join(missing)}",), "Forbidden"), None, ()
    runtime.cluster_digests[cluster] = digest
    if review:
        runtime.cluster_reviewed[cluster] = now
    return Registration(version=version), client, tuple(spec.allowed_namespaces)
