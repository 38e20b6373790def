"""A small asynchronous Kubernetes client (httpx) for the operator's own writes, in its
cluster and in registered remote clusters, plus kubeconfig checks.

The operator creates or merge-patches whole objects it owns, reads a few, and deletes by
name; no watches (kopf does those). Kubeconfigs of remote clusters are accepted the way
Kueue's MultiKueue accepts them: self-contained, no exec plugins, auth providers, file
paths or disabled TLS verification.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any

import httpx

PLURALS = {"Namespace": "namespaces", "ConfigMap": "configmaps", "Service": "services", "Secret": "secrets",
           "Deployment": "deployments", "Job": "jobs", "RLJob": "rljobs", "RLCluster": "rlclusters",
           "Event": "events", "PersistentVolumeClaim": "persistentvolumeclaims"}
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


def path_of(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    out = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{PLURALS[kind]}"
    return out + (f"/{name}" if name else "")


def path_for(obj: dict) -> str:
    meta = obj["metadata"]
    return path_of(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])


class KubeClient:
    def __init__(self, server: str, token: str | None = None, verify: ssl.SSLContext | bool = True,
                 name: str = "local"):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.name = name
        self.server = server.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.server, headers=headers, verify=verify, timeout=15.0)

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def in_cluster(cls) -> KubeClient:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        return cls(f"https://{host}:{port}", (SERVICE_ACCOUNT / "token").read_text().strip(), context)

    @classmethod
    def from_kubeconfig(cls, config: dict, name: str) -> KubeClient:
        """A client from a self-contained kubeconfig (check it with kubeconfig_problems first)."""
        problems = kubeconfig_problems(config)
        if problems:
            raise ValueError("; ".join(problems))
        cluster, user = _current(config)
        context = ssl.create_default_context()
        if cluster.get("certificate-authority-data"):
            ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
            context = ssl.create_default_context(cadata=ca)
        if user.get("client-certificate-data"):
            with tempfile.TemporaryDirectory() as tmp:  # ssl loads chains from files only
                cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
                cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
                key.write_bytes(base64.b64decode(user["client-key-data"]))
                context.load_cert_chain(cert, key)
        return cls(cluster["server"], user.get("token"), context, name=name)

    # ---- requests -------------------------------------------------------------------
    async def _request(self, method: str, path: str, **kw) -> dict | None:
        resp = await self._http.request(method, path, **kw)
        if resp.status_code == 404 and method in ("GET", "DELETE"):
            return None
        if resp.status_code >= 400:
            try:
                message = resp.json().get("message", resp.text)
            except ValueError:
                message = resp.text
            raise KubeError(resp.status_code, f"{method} {path}: {message}")
        return resp.json() if resp.content else {}

    async def get(self, path: str) -> dict | None:
        return await self._request("GET", path)

    async def create(self, obj: dict) -> dict:
        meta = obj["metadata"]
        return await self._request("POST", path_of(obj["apiVersion"], obj["kind"], meta.get("namespace")), json=obj)

    async def patch(self, path: str, body: dict) -> dict:
        return await self._request("PATCH", path, json=body,
                                   headers={"Content-Type": "application/merge-patch+json"})

    async def delete(self, path: str, propagation: str = "Background") -> bool:
        """True when something was deleted. Background: the object goes now, its dependents
        after; Foreground: it stays (with a deletionTimestamp) until its dependents are gone."""
        return await self._request("DELETE", path, json={"propagationPolicy": propagation}) is not None

    async def apply(self, obj: dict) -> tuple[str, dict]:
        """Create the object, or merge-patch it to the desired state when it differs;
        ("created"|"updated"|"unchanged", object). Fields the server or others filled in
        (a Service's node port, a Deployment's status) are left alone."""
        current = await self.get(path_for(obj))
        if current is None:
            return "created", await self.create(obj)
        if contains(current, obj):
            return "unchanged", current
        return "updated", await self.patch(path_for(obj), obj)

    async def list(self, api_version: str, kind: str, namespace: str | None, label_selector: str) -> list[dict]:
        reply = await self._request("GET", path_of(api_version, kind, namespace),
                                    params={"labelSelector": label_selector})
        return (reply or {}).get("items", [])

    async def version(self) -> dict:
        return await self._request("GET", "/version") or {}

    async def close(self) -> None:
        await self._http.aclose()


def contains(current: Any, desired: Any) -> bool:
    """Whether `current` already has every field of `desired` (maps: a superset; lists:
    the same length, item by item)."""
    if isinstance(desired, dict):
        return isinstance(current, dict) and all(k in current and contains(current[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(current, list) and len(current) == len(desired) and all(
            contains(c, d) for c, d in zip(current, desired))
    return current == desired


def _current(config: dict) -> tuple[dict, dict]:
    contexts = {c["name"]: c.get("context", {}) for c in config.get("contexts") or []}
    name = config.get("current-context") or (next(iter(contexts)) if len(contexts) == 1 else None)
    if name not in contexts:
        raise ValueError(f"current-context {name!r} is not among the contexts")
    ctx = contexts[name]
    clusters = {c["name"]: c.get("cluster", {}) for c in config.get("clusters") or []}
    users = {u["name"]: u.get("user", {}) for u in config.get("users") or []}
    if ctx.get("cluster") not in clusters:
        raise ValueError(f"context {name!r} names cluster {ctx.get('cluster')!r}, which is not defined")
    if ctx.get("user") not in users:
        raise ValueError(f"context {name!r} names user {ctx.get('user')!r}, which is not defined")
    return clusters[ctx["cluster"]], users[ctx["user"]]


def kubeconfig_problems(config: Any) -> list[str]:
    """Why a kubeconfig cannot be used to reach another cluster ([] = usable): it must be
    self-contained and must not run programs or skip TLS verification."""
    if not isinstance(config, dict):
        return ["not a kubeconfig (expected a YAML mapping)"]
    try:
        cluster, user = _current(config)
    except (ValueError, KeyError, TypeError) as err:
        return [str(err)]
    problems = []
    if not str(cluster.get("server", "")).startswith("https://"):
        problems.append("cluster.server must be an https:// URL")
    if cluster.get("insecure-skip-tls-verify"):
        problems.append("cluster.insecure-skip-tls-verify is not allowed")
    if cluster.get("certificate-authority"):
        problems.append("cluster.certificate-authority (a file path) is not allowed; use certificate-authority-data")
    for key in ("exec", "auth-provider"):
        if user.get(key):
            problems.append(f"user.{key} is not allowed (it runs code in the operator)")
    for key in ("tokenFile", "token-file", "client-certificate", "client-key"):
        if user.get(key):
            problems.append(f"user.{key} (a file path) is not allowed; embed the data")
    if not user.get("token") and not (user.get("client-certificate-data") and user.get("client-key-data")):
        problems.append("user needs a token or client-certificate-data with client-key-data")
    return problems
