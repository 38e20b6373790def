"""The RLCluster spec is typed: a good spec parses with its defaults, a bad one is refused
with each field named (the operator then marks the RLCluster Inactive, reason InvalidSpec)."""

import pytest

from streamrl.operator.clusters import ClusterPhase, Registration, RLClusterSpec, parse_cluster_spec, register
from streamrl.operator.runtime import Runtime


def test_a_good_spec_parses_with_the_default_key():
    spec = parse_cluster_spec({"kubeconfigSecretRef": {"name": "west-kubeconfig"}, "allowedNamespaces": ["rl"]})
    assert spec == RLClusterSpec(kubeconfig_secret_ref={"name": "west-kubeconfig", "key": "kubeconfig"},
                                 allowed_namespaces=["rl"])
    assert spec.kubeconfig_secret_ref.key == "kubeconfig"


ANY = {"allowedNamespaces": ["*"]}


@pytest.mark.parametrize("spec, message", [
    ({}, "spec.kubeconfigSecretRef: Field required; spec.allowedNamespaces: Field required"),
    (None, "spec.kubeconfigSecretRef: Field required; spec.allowedNamespaces: Field required"),
    ({"kubeconfigSecretRef": {}, **ANY}, "spec.kubeconfigSecretRef.name: Field required"),
    ({"kubeconfigSecretRef": {"name": "w", "keys": "k"}, **ANY}, "spec.kubeconfigSecretRef.keys: unknown field"),
    ({"kubeconfigSecretRef": {"name": 7}, **ANY}, "spec.kubeconfigSecretRef.name: Input should be a valid string"),
    ({"kubeconfigSecretRef": {"name": "w" * 254}, **ANY},
     "spec.kubeconfigSecretRef.name: String should have at most 253 characters"),
    ({"kubeconfigSecretRef": {"name": "w"}, "allowedNamespaces": []},
     "spec.allowedNamespaces: List should have at least 1 item after validation, not 0"),
    ({"kubeconfigSecretRef": {"name": "w"}, "allowedNamespaces": ["rl", "Team_A"]},
     "spec.allowedNamespaces: 'Team_A': a namespace name (DNS-1123 label) or \"*\""),
])
def test_a_bad_spec_is_refused_with_the_field_named(spec, message):
    with pytest.raises(ValueError) as err:
        parse_cluster_spec(spec)
    assert str(err.value) == message


class _FakeClient:
    closed = False

    async def close(self):
        self.closed = True


class _FakeKube:
    """An API server the registration must not need for a spec it refuses."""

    async def get(self, path: str):
        raise AssertionError(f"read {path} for a spec that does not parse")


async def test_an_invalid_spec_makes_the_cluster_inactive_with_the_field_named():
    runtime = Runtime(_FakeKube())
    runtime.clusters["west"] = _FakeClient()  # registered before its spec broke: forgotten, closed
    result = await register(runtime, "west", {"kubeconfigSecret": {"name": "west-kubeconfig"}, **ANY})
    assert result == Registration(("spec.kubeconfigSecretRef: Field required; spec.kubeconfigSecret: unknown field",),
                                  "InvalidSpec")
    status = result.status("2026-12-02T10:00:00Z")
    assert (status["phase"], status["message"]) == (ClusterPhase.INACTIVE.value, result.problems[0])
    assert (status["conditions"][0]["status"], status["conditions"][0]["reason"]) == ("False", "InvalidSpec")
    assert runtime.clusters == {}
