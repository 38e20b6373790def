"""Kubeconfigs of other clusters are accepted only when self-contained and safe (as Kueue's
MultiKueue requires), and the client built from one uses what it says."""

import base64
import copy
import json
import os
import ssl
import tempfile

import httpx
import pytest

from streamrl.operator.kube import FIELD_MANAGER, KubeClient, KubeError, kubeconfig_problems, path_of
from streamrl.spec import API_VERSION
from tests.integration.certs import TestCA

GOOD = {
    "apiVersion": "v1", "kind": "Config", "current-context": "west",
    "contexts": [{"name": "west", "context": {"cluster": "west", "user": "rl"}}],
    "clusters": [{"name": "west", "cluster": {"server": "https://203.0.113.9:6443"}}],
    "users": [{"name": "rl", "user": {"token": "s3cr3t"}}],
}


def _with(section: str, **fields) -> dict:
    config = copy.deepcopy(GOOD)
    config[section][0][section[:-1]].update(fields)
    return config


@pytest.mark.parametrize("config, problem", [
    (_with("users", exec={"command": "aws"}), "user.exec is not allowed"),
    (_with("users", **{"auth-provider": {"name": "gcp"}}), "user.auth-provider is not allowed"),
    (_with("users", tokenFile="/var/run/token"), "user.tokenFile (a file path) is not allowed"),
    (_with("users", **{"client-certificate": "/c.crt"}), "user.client-certificate (a file path) is not allowed"),
    (_with("clusters", **{"certificate-authority": "/ca.crt"}), "cluster.certificate-authority (a file path)"),
    (_with("clusters", **{"insecure-skip-tls-verify": True}), "insecure-skip-tls-verify is not allowed"),
    (_with("clusters", server="http://203.0.113.9:8080"), "cluster.server must be an https:// URL"),
    ({**GOOD, "users": [{"name": "rl", "user": {}}]}, "user needs a token or client-certificate-data"),
    ({**GOOD, "current-context": "east"}, "current-context 'east' is not among the contexts"),
    ("just a string", "not a kubeconfig"),
])
def test_unsafe_or_incomplete_kubeconfigs_are_refused_with_the_reason(config, problem):
    problems = kubeconfig_problems(config)
    assert any(problem in p for p in problems), problems
    if isinstance(config, dict) and not problem.startswith("current-context"):
        with pytest.raises(ValueError, match="not allowed|must be|needs"):
            KubeClient.from_kubeconfig(config, "west")


async def test_a_good_kubeconfig_builds_a_client_for_its_server():
    assert kubeconfig_problems(GOOD) == []
    ca = base64.b64encode(b"not a certificate").decode()
    with pytest.raises(ssl.SSLError):  # embedded CA data is really loaded (and this one is garbage)
        KubeClient.from_kubeconfig(_with("clusters", **{"certificate-authority-data": ca}), "west")
    client = KubeClient.from_kubeconfig(GOOD, "west")
    assert client.server == "https://203.0.113.9:6443" and client.name == "west"
    assert client._http.headers["Authorization"] == "Bearer s3cr3t"
    await client.close()


def test_paths():
    assert path_of("v1", "ConfigMap", "rl", "x-spec") == "/api/v1/namespaces/rl/configmaps/x-spec"
    assert path_of("apps/v1", "Deployment", "rl") == "/apis/apps/v1/namespaces/rl/deployments"
    assert path_of(API_VERSION, "RLCluster", None, "west") == f"/apis/{API_VERSION}/rlclusters/west"


class _FakeServer:
    """Records each request; answers 401 to a token it was not told is current."""

    def __init__(self, token: str = ""):
        self.token, self.requests, self.tokens = token, [], []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.tokens.append(request.headers.get("Authorization"))  # the request object is reused on a retry
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return httpx.Response(401, json={"kind": "Status", "reason": "Unauthorized", "message": "Unauthorized"})
        if request.method == "POST":
            return httpx.Response(422, json={"kind": "Status", "reason": "Invalid",
                                             "message": "Service \"7b-trainer\" is invalid: metadata.name"})
        return httpx.Response(200, json={"metadata": {"name": "x", "resourceVersion": "7"}})


def _client(server: _FakeServer, **kw) -> KubeClient:
    client = KubeClient("https://k8s.example", **kw)
    client._http._transport = httpx.MockTransport(server)
    return client


async def test_apply_is_a_server_side_apply_under_the_operators_field_manager_forced():
    server = _FakeServer()
    client = _client(server)
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "namespace": "rl"}, "spec": {}}
    await client.apply(obj)
    [request] = server.requests
    assert (request.method, request.url.path) == ("PATCH", "/apis/apps/v1/namespaces/rl/deployments/x")
    assert request.headers["Content-Type"] == "application/apply-patch+yaml"
    assert dict(request.url.params) == {"fieldManager": FIELD_MANAGER, "force": "true"}
    assert json.loads(request.content) == obj  # the whole desired object (JSON is YAML)
    await client.close()


async def test_a_refusal_carries_the_servers_reason_and_says_asking_again_will_not_help():
    client = _client(_FakeServer())
    with pytest.raises(KubeError) as err:
        await client.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "7b-trainer",
                                                                                  "namespace": "rl"}})
    assert (err.value.status, err.value.reason, err.value.refused) == (422, "Invalid", True)
    assert "metadata.name" in err.value.message
    assert not KubeError(409, "exists", "AlreadyExists").refused and not KubeError(429, "slow down").refused
    assert not KubeError(503, "unavailable").refused
    await client.close()


async def test_the_service_account_token_is_read_again_when_the_kubelet_rotates_it(tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    server = _FakeServer("first")
    client = _client(server, token_file=token)
    assert await client.get("/api/v1/namespaces/rl/configmaps/x")
    token.write_text("second\n")  # rotated: a new mtime
    os.utime(token, (os.path.getmtime(token) + 5,) * 2)
    server.token = "second"
    assert await client.get("/api/v1/namespaces/rl/configmaps/x")
    assert server.tokens == ["Bearer first", "Bearer second"]
    # A 401 makes it read the file at once and try once more (rotated within the same second).
    token.write_text("third")
    os.utime(token, (os.path.getmtime(token),) * 2)
    server.token, server.tokens = "third", []
    client._http.auth._mtime = os.path.getmtime(token)  # as if this write had already been seen
    assert await client.get("/api/v1/namespaces/rl/configmaps/x")
    assert server.tokens == ["Bearer second", "Bearer third"]
    await client.close()


def test_a_client_certificate_is_loaded_without_writing_its_key_to_any_file(tmp_path, monkeypatch):
    authority = TestCA(tmp_path / "certs")
    cert_file, key_file = authority.issue("operator")
    cert, key, ca = cert_file.read_bytes(), key_file.read_bytes(), authority.ca_file.read_bytes()
    spy = tmp_path / "tmp"
    spy.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spy))
    config = _with("users", **{"client-certificate-data": base64.b64encode(cert).decode(),
                               "client-key-data": base64.b64encode(key).decode()})
    config["users"][0]["user"].pop("token")
    config["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(ca).decode()
    client = KubeClient.from_kubeconfig(config, "west")
    assert client.server == "https://203.0.113.9:6443"
    assert list(spy.iterdir()) == []  # nothing went through a temporary file
