"""A small asynchronous Kubernetes client (httpx) for the operator's own writes, in its
cluster and in registered remote clusters, plus kubeconfig checks.

Objects the operator owns are written with server-side apply under one field manager
(`FIELD_MANAGER`, conflicts forced): the server merges, drops the keys the operator stopped
applying and writes nothing when nothing changed. It also creates a few objects once
(`create`), reads some and deletes by name; no watches (kopf does those). The in-cluster
token is re-read when the kubelet rotates it. Kubeconfigs of remote clusters are accepted
the way Kueue's MultiKueue accepts them: self-contained, no exec plugins, auth providers,
file paths or disabled TLS verification; their client keys stay in memory.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import httpx

from streamrl.wire.addresses import join_host_port

PLURALS = {"Namespace": "namespaces", "ConfigMap": "configmaps", "Service": "services", "Secret": "secrets",
           "Deployment": "deployments", "Job": "jobs", "RLJob": "rljobs", "RLCluster": "rlclusters",
           "Event": "events", "PersistentVolumeClaim": "persistentvolumeclaims", "Pod": "pods",
           "NetworkPolicy": "networkpolicies", "SelfSubjectAccessReview": "selfsubjectaccessreviews",
           "Lease": "leases", "Workload": "workloads"}
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
FIELD_MANAGER = "streamrl-operator"
"""The field manager of every write (managedFields shows it; server-side apply owns by it)."""
TOKEN_REREAD_S = 60.0
"""How often a token file is read again at the latest (client-go's period): the kubelet
rotates projected service-account tokens well before they expire."""


class KubeError(RuntimeError):
    """The API server refused a request: its HTTP status, its reason (Invalid, Forbidden,
    AlreadyExists...) and its message."""

    def __init__(self, status: int, message: str, reason: str = ""):
        super().__init__(f"{status}{' ' + reason if reason else ''}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def refused(self) -> bool:
        """A 4xx that asking again will not change (not 409 Conflict, not 429 Too Many Requests):
        the object as built, or the operator's rights, must change first."""
        return 400 <= self.status < 500 and self.status not in (409, 429)


def path_of(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    out = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{PLURALS[kind]}"
    return out + (f"/{name}" if name else "")


def path_for(obj: dict) -> str:
    meta = obj["metadata"]
    return path_of(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])


class _TokenFile(httpx.Auth):
    """`Authorization: Bearer <the file's token>`, read again when the file changed, at least
    every TOKEN_REREAD_S, and at once after a 401 (then the request is sent once more)."""

    def __init__(self, path: Path):
        self.path = path
        self._token, self._read_at, self._mtime = "", 0.0, 0.0

    def _current(self, force: bool = False) -> str:
        mtime = self.path.stat().st_mtime
        if force or mtime != self._mtime or time.monotonic() - self._read_at > TOKEN_REREAD_S:
            self._token, self._mtime, self._read_at = self.path.read_text().strip(), mtime, time.monotonic()
        return self._token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._current()}"
        response = yield request
        if response.status_code == 401:
            request.headers["Authorization"] = f"Bearer {self._current(force=True)}"
            yield request


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a client certificate from files only: anonymous in-memory files where Linux
    has them (memfd), so a remote cluster's key never reaches a filesystem; elsewhere a
    private temporary directory, removed at once."""
    if hasattr(os, "memfd_create"):
        fds = [os.memfd_create(n, os.MFD_CLOEXEC) for n in ("tls.crt", "tls.key")]
        try:
            for fd, data in zip(fds, (cert, key)):
                os.write(fd, data)
            context.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory() as tmp:  # pragma: no cover (not Linux)
        paths = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        for path, data in zip(paths, (cert, key)):
            path.write_bytes(data)
        context.load_cert_chain(*paths)


class KubeClient:
    def __init__(self, server: str, token: str | None = None, verify: ssl.SSLContext | bool = True,
                 name: str = "local", token_file: Path | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.name = name
        self.server = server.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.server, headers=headers, verify=verify, timeout=15.0,
                                       auth=_TokenFile(token_file) if token_file else None)

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def in_cluster(cls) -> KubeClient:
        """The pod's service account; its projected token is re-read as the kubelet rotates it."""
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        # an IPv6-only cluster's API server is an IPv6 literal: in brackets in the URL
        return cls(f"https://{join_host_port(host, int(port))}", verify=context, token_file=SERVICE_ACCOUNT / "token")

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
            _load_cert_chain(context, base64.b64decode(user["client-certificate-data"]),
                             base64.b64decode(user["client-key-data"]))
        return cls(cluster["server"], user.get("token"), context, name=name)

    # ---- requests -------------------------------------------------------------------
    async def _request(self, method: str, path: str, **kw) -> dict | None:
        resp = await self._http.request(method, path, **kw)
        if resp.status_code == 404 and method in ("GET", "DELETE"):
            return None
        _raise_for(resp, method, path)
        return resp.json() if resp.content else {}

    async def get(self, path: str) -> dict | None:
        return await self._request("GET", path)

    async def _write(self, method: str, path: str, **kw) -> dict:
        """A write's answer (only a GET's or a DELETE's 404 answers None)."""
        out = await self._request(method, path, **kw)
        assert out is not None
        return out

    async def create(self, obj: dict) -> dict:
        """POST the object (KubeError 409 when it exists)."""
        meta = obj["metadata"]
        return await self._write("POST", path_of(obj["apiVersion"], obj["kind"], meta.get("namespace")),
                                   json=obj, params={"fieldManager": FIELD_MANAGER})

    async def patch(self, path: str, body: dict) -> dict:
        """A JSON merge patch (status writes, replicas guarded by a resourceVersion)."""
        return await self._write("PATCH", path, json=body, params={"fieldManager": FIELD_MANAGER},
                                   headers={"Content-Type": "application/merge-patch+json"})

    async def json_patch(self, path: str, ops: list[dict]) -> dict:
        """An RFC 6902 JSON patch (managedFields, which a merge patch cannot replace whole)."""
        return await self._write("PATCH", path, json=ops, params={"fieldManager": FIELD_MANAGER},
                                   headers={"Content-Type": "application/json-patch+json"})

    async def apply(self, obj: dict) -> dict:
        """Server-side apply: the object becomes what `obj` says for every field the operator
        applies (created when missing; fields it applied before and leaves out now are
        removed; fields others own are kept; nothing is written when nothing changes).
        Conflicts with other managers are forced: these fields are the operator's."""
        return await self._write("PATCH", path_for(obj), json=obj,
                                   params={"fieldManager": FIELD_MANAGER, "force": "true"},
                                   headers={"Content-Type": "application/apply-patch+yaml"})

    async def delete(self, path: str, propagation: str = "Background") -> bool:
        """True when something was deleted. Background: the object goes now, its dependents
        after; Foreground: it stays (with a deletionTimestamp) until its dependents are gone."""
        return await self._request("DELETE", path, json={"propagationPolicy": propagation}) is not None

    async def list(self, api_version: str, kind: str, namespace: str | None, label_selector: str = "",
                   field_selector: str = "") -> list[dict]:
        params = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        reply = await self._request("GET", path_of(api_version, kind, namespace), params=params)
        return (reply or {}).get("items", [])

    async def log_tail(self, namespace: str, pod: str, container: str, lines: int = 1) -> str:
        """The last `lines` lines a pod's container wrote ("" when the pod is gone)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/log"
        resp = await self._http.get(path, params={"container": container, "tailLines": lines})
        if resp.status_code == 404:
            return ""
        _raise_for(resp, "GET", path)
        return resp.text

    async def version(self) -> dict:
        return await self._request("GET", "/version") or {}

    async def close(self) -> None:
        await self._http.aclose()


def _raise_for(resp: httpx.Response, method: str, path: str) -> None:
    """KubeError with the API server's message and reason for an error response."""
    if resp.status_code < 400:
        return
    reason = ""
    try:
        body = resp.json()
        message, reason = body.get("message", resp.text), body.get("reason", "")
    except (ValueError, AttributeError):
        message = resp.text
    raise KubeError(resp.status_code, f"{method} {path}: {message}", reason)


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
