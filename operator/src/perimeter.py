"""The fence around one job, secure by default: the token every role presents and checks (a
Secret, mounted as a file, minted unless the spec names a token file of its own) and the
NetworkPolicies that let only the job's own pods, the operator's namespace and Prometheus
reach its ports. Pure, but for the key the tokens derive from (`token_key`).

A job's token is HMAC-SHA256(key, cluster/namespace/name/uid): the operator can write it
again, in this cluster and in a remote pool's, without reading any Secret of a job's
namespace, and a re-created job (new uid) gets a new one. The key is a Secret in the
operator's namespace, created on first use.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING

from streamrl.operator.kube import KubeError, path_of
from streamrl.operator.names import (
    ADMIN_PORT,
    COMPLETION_INDEX,
    TRAINER_GRPC_PORT,
    labels,
    name,
    object_meta,
    selector,
)
from streamrl.operator.settings import Settings
from streamrl.spec import RLJob

if TYPE_CHECKING:
    from streamrl.operator.kube import KubeClient

TOKEN_KEY = "token"
"""The data key of a job's token Secret (the file the pods read: /etc/streamrl/token/token)."""
KEY_BYTES = 32


def job_token(key: bytes, cluster: str, namespace: str, job: str, uid: str) -> str:
    """The job's bearer token (hex): the same for the same job, new for a re-created one."""
    return hmac.new(key, f"{cluster}/{namespace}/{job}/{uid}".encode(), hashlib.sha256).hexdigest()


def build_token_secret(job: RLJob, namespace: str, token: str, owner: dict | None = None,
                       origin: dict[str, str] | None = None) -> dict:
    """The Secret every pod of the job mounts at /etc/streamrl/token (never an env var)."""
    j = job.metadata.name
    meta = object_meta(name(j, "token"), namespace, {**labels(j, "token"), **(origin or {})}, owner)
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()}}


def _admin_ports(job: RLJob) -> list[dict]:
    """Every admin port of the job's pods: ADMIN_PORT, and one per further rank of a trainer pod."""
    port = {"protocol": "TCP", "port": ADMIN_PORT}
    last = ADMIN_PORT + job.spec.trainer.processes_per_node - 1
    return [{**port, "endPort": last} if last > ADMIN_PORT else port]


def build_network_policies(job: RLJob, namespace: str, settings: Settings, owner: dict | None = None,
                           operator_namespace: str | None = None,
                           origin: dict[str, str] | None = None) -> list[dict]:
    """Ingress to the job's pods: from its own pods (any port: gRPC, relay, rendezvous, admin),
    from the operator's namespace (admin: the trainer's /status) and from the Prometheus peer
    (admin: /metrics); an exposed trainer (NodePort, LoadBalancer) also takes gRPC from
    outside (from trainer.service.allowFrom when set; TLS is then required). The
    operator's namespace is matched by its immutable name label, which tenants cannot set.
    `operator_namespace` None: a remote cluster (no operator reads the pods there)."""
    j = job.metadata.name
    admin = _admin_ports(job)
    ingress: list[dict] = [{"from": [{"podSelector": {"matchLabels": selector(j)}}]}]
    if operator_namespace:
        ingress.append({"from": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": operator_namespace}}}], "ports": admin})
    if settings.prometheus_peer:
        ingress.append({"from": [dict(settings.prometheus_peer)], "ports": admin})
    meta = object_meta(name(j, "job"), namespace, {**labels(j, "network"), **(origin or {})}, owner)
    out = [{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta,
            "spec": {"podSelector": {"matchLabels": selector(j)}, "policyTypes": ["Ingress"], "ingress": ingress}}]
    trainer = job.spec.trainer
    if trainer.service_type != "ClusterIP" and operator_namespace:
        grpc = {"ports": [{"protocol": "TCP", "port": TRAINER_GRPC_PORT}]}
        # Not loadBalancerSourceRanges: a proxying load balancer's own addresses are the source
        # here, and the balancer enforces those ranges itself (N10).
        if trainer.service.allow_from:
            grpc["from"] = [{"ipBlock": {"cidr": cidr}} for cidr in trainer.service.allow_from]
        out.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                    "metadata": object_meta(name(j, "trainer-exposed"), namespace, labels(j, "network"), owner),
                    "spec": {"podSelector": {"matchLabels": {**selector(j, "trainer"), COMPLETION_INDEX: "0"}},
                             "policyTypes": ["Ingress"], "ingress": [grpc]}})
    return out


async def token_key(kube: KubeClient, settings: Settings) -> bytes:
    """The key job tokens derive from: read from its Secret in the operator's namespace, or
    created there (random) on first use; a concurrent creator's key wins."""
    path = path_of("v1", "Secret", settings.namespace, settings.token_key_secret)
    secret = await kube.get(path)
    if secret is None:
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": settings.token_key_secret, "namespace": settings.namespace,
                             "labels": {"app.kubernetes.io/name": "streamrl",
                                        "app.kubernetes.io/managed-by": "streamrl-operator"}},
                "data": {"key": base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()}}
        try:
            secret = await kube.create(body)
        except KubeError as err:
            if err.status != 409:
                raise
            secret = await kube.get(path)
    try:
        raw = base64.b64decode(((secret or {}).get("data") or {}).get("key", ""), validate=True)
    except binascii.Error:
        raw = b""
    if len(raw) < 16:
        raise ValueError(f"Secret {settings.namespace}/{settings.token_key_secret}: data.key must hold at least 16 "
                         "bytes, base64-encoded (delete it and the operator creates a new one; running jobs then get "
                         "new tokens only when their pods restart)")
    return raw
