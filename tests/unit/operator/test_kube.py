"""Kubeconfigs of other clusters are accepted only when self-contained and safe (as Kueue's
MultiKueue requires), and the client built from one uses what it says."""

import base64
import copy
import ssl

import pytest

from streamrl.operator.kube import KubeClient, contains, kubeconfig_problems, path_of
from streamrl.spec import API_VERSION

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


def test_contains_decides_whether_an_apply_writes():
    desired = {"spec": {"ports": [{"name": "grpc", "port": 50051}], "type": "NodePort"}}
    allocated = {"spec": {"ports": [{"name": "grpc", "port": 50051, "nodePort": 31051}], "type": "NodePort",
                          "clusterIP": "10.0.0.7"}, "status": {}}
    assert contains(allocated, desired)  # server-filled fields do not trigger a write
    assert not contains(allocated, {"spec": {"type": "LoadBalancer"}})
    assert not contains(allocated, {"spec": {"ports": [{"name": "grpc"}, {"name": "admin"}]}})
