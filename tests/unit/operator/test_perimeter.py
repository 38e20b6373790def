"""The fence around a job: its token (derived, stable, new for a re-created job), the Secret
pods read it from, the NetworkPolicies that let only the job's pods, the operator and
Prometheus in, an exposed trainer's gRPC port alone, and the key tokens derive from."""

import base64
from pathlib import Path

import kubernetes_validate
import pytest

from streamrl.operator.builders import build_children, build_generators
from streamrl.operator.kube import KubeError, path_of
from streamrl.operator.names import COMPLETION_INDEX, owner_reference
from streamrl.operator.perimeter import (
    build_network_policies,
    build_token_secret,
    job_token,
    token_key,
)
from streamrl.operator.settings import Settings
from streamrl.spec import API_VERSION, RLJob, load_job, parse_job

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("rljob-*.yaml"))
OWNER = owner_reference({"apiVersion": API_VERSION, "kind": "RLJob", "metadata": {"name": "any", "uid": "u-1"}})
KEY = bytes(range(32))
TOKEN = job_token(KEY, "home", "rl", "p", "u-1")
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
              "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
SETTINGS = Settings(namespace="streamrl-system", prometheus_peer=PROMETHEUS)
TLS = {"tls": {"secretName": "p-tls"}}
SKEWNESS = {"dispatch": {"policy": "skewness-aware"}, "pools": [{"name": "a"}, {"name": "b"}]}


def _job(name: str = "p", **spec) -> RLJob:
    return parse_job({"metadata": {"name": name}, "spec": {"model": {"source": "builtin-tiny"}, **spec}})


def _children(job: RLJob, settings: Settings = SETTINGS) -> list[dict]:
    return build_children(job, "rl", settings, OWNER, TOKEN)


def _policies(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "NetworkPolicy"}


def _pod_labels(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
            for o in objects if o["kind"] in ("Job", "Deployment")}


# ---- the token ----------------------------------------------------------------------------
def test_a_jobs_token_is_the_same_for_the_same_job_and_new_for_any_other():
    token = job_token(KEY, "home", "rl", "p", "u-1")
    assert token == job_token(KEY, "home", "rl", "p", "u-1")
    assert len(token) == 64 and set(token) <= set("0123456789abcdef")  # hex of HMAC-SHA256
    others = {job_token(KEY, "home", "rl", "p", "u-2"),  # the same name, re-created
              job_token(KEY, "home", "other", "p", "u-1"),
              job_token(KEY, "west", "rl", "p", "u-1"),
              job_token(KEY, "home", "rl", "q", "u-1"),
              job_token(bytes(32), "home", "rl", "p", "u-1")}
    assert len(others) == 5 and token not in others


def test_the_token_secret_holds_the_token_under_its_file_name():
    secret = build_token_secret(_job(), "rl", TOKEN, OWNER)
    assert kubernetes_validate.validate(secret, "1.33", strict=True) == "1.33"
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"], secret["type"]) == ("p-token", "rl", "Opaque")
    assert secret["metadata"]["ownerReferences"] == [OWNER]
    assert secret["metadata"]["labels"]["streamrl.io/job"] == "p"
    assert set(secret["data"]) == {"token"}  # mounted at /etc/streamrl/token: the file .../token
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN


# ---- the job's NetworkPolicy --------------------------------------------------------------
JOBS = {
    **{p.name: (lambda p=p: load_job(p)) for p in EXAMPLES},
    "sharded-2x4": lambda: _job(trainer={"nodes": 2, "processesPerNode": 4}, generators=SKEWNESS),
}


@pytest.mark.parametrize("make", JOBS.values(), ids=JOBS.keys())
def test_every_built_object_validates_strictly(make):
    objects = _children(make())
    assert {"NetworkPolicy", "Secret"} <= {o["kind"] for o in objects}
    for obj in objects:
        assert kubernetes_validate.validate(obj, "1.33", strict=True) == "1.33", obj["metadata"]["name"]


@pytest.mark.parametrize("make", JOBS.values(), ids=JOBS.keys())
def test_the_policy_selects_every_pod_of_the_job(make):
    job = make()
    objects = _children(job)
    [policy] = [p for n, p in _policies(objects).items() if n == f"{job.metadata.name}-job"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected == {"streamrl.io/job": job.metadata.name}
    pods = _pod_labels(objects)
    roles = {labels["streamrl.io/role"] for labels in pods.values()}
    assert roles >= {"trainer", "generator"}
    if job.spec.generators.dispatch.policy == "skewness-aware":
        assert "ranker" in roles
    for name, labels in pods.items():
        assert selected.items() <= labels.items(), name


def test_a_remote_pools_pods_are_selected_by_the_remote_policy():
    job = load_job(ROOT / "deploy/examples/rljob-cross-dc.yaml")
    origin = {"streamrl.io/origin-cluster": "home", "streamrl.io/origin-namespace": "rl"}
    remote = build_generators(job, "west", "rl", SETTINGS, "203.0.113.7:50051", origin=origin)
    [policy] = build_network_policies(job, "rl", SETTINGS, origin=origin)  # no operator there: no exposed one
    assert kubernetes_validate.validate(policy, "1.33", strict=True) == "1.33"
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= remote["spec"]["template"]["metadata"][
        "labels"].items()
    assert policy["metadata"]["labels"]["streamrl.io/origin-cluster"] == "home"
    # neither the operator's namespace (it reads no pod there) nor anything but the pool's own pods and Prometheus
    assert [r["from"] for r in policy["spec"]["ingress"]] == [
        [{"podSelector": {"matchLabels": {"streamrl.io/job": "cross-dc-counting"}}}], [PROMETHEUS]]


@pytest.mark.parametrize("per_node, admin", [
    (1, [{"protocol": "TCP", "port": 8080}]),
    (4, [{"protocol": "TCP", "port": 8080, "endPort": 8083}]),  # every rank's admin: 8080 + its local rank
])
def test_the_jobs_own_pods_reach_any_port_the_operator_and_prometheus_only_admin(per_node, admin):
    objects = _children(_job(trainer={"nodes": 2, "processesPerNode": per_node}, generators=SKEWNESS))
    assert set(_policies(objects)) == {"p-job"}
    spec = _policies(objects)["p-job"]["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {"streamrl.io/job": "p"}}}]},  # no ports: gRPC, relay, rendezvous
        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "streamrl-system"}}}],
         "ports": admin},
        {"from": [PROMETHEUS], "ports": admin},
    ]
    [trainer] = [o for o in objects if o["kind"] == "Job"]
    ports = {p["name"]: p["containerPort"] for p in trainer["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert sorted(p for n, p in ports.items() if n.startswith("admin")) == list(range(8080, 8080 + per_node))


def test_without_a_prometheus_peer_nothing_scrapes():
    spec = _policies(_children(_job(), Settings(namespace="streamrl-system")))["p-job"]["spec"]
    assert [r["from"] for r in spec["ingress"]] == [
        [{"podSelector": {"matchLabels": {"streamrl.io/job": "p"}}}],
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "streamrl-system"}}}]]


def test_no_policy_when_the_operator_is_told_not_to():
    objects = _children(_job(generators=SKEWNESS), Settings(network_policy=False))
    assert "NetworkPolicy" not in {o["kind"] for o in objects}
    assert "Secret" in {o["kind"] for o in objects}  # the token stays


# ---- an exposed trainer -------------------------------------------------------------------
def test_a_cluster_ip_trainer_has_no_exposed_policy():
    assert set(_policies(_children(_job(trainer={"serviceType": "ClusterIP"})))) == {"p-job"}


@pytest.mark.parametrize("service_type", ["NodePort", "LoadBalancer"])
def test_an_exposed_trainer_needs_tls(service_type):
    with pytest.raises(ValueError, match="security.tls is required"):
        _job(trainer={"serviceType": service_type})


@pytest.mark.parametrize("trainer, sources", [
    ({"serviceType": "NodePort"}, None),
    ({"serviceType": "LoadBalancer"}, None),
    # N10: the balancer enforces its source ranges; behind a proxying one (AWS Classic ELB, NLB IP
    # targets) the pod sees the balancer's addresses, which a policy copying them would drop.
    ({"serviceType": "LoadBalancer", "service": {"loadBalancerSourceRanges": ["203.0.113.0/24"]}}, None),
    ({"serviceType": "LoadBalancer", "service": {"loadBalancerSourceRanges": ["203.0.113.0/24"],
                                                 "allowFrom": ["203.0.113.0/24", "10.0.0.0/8"]}},
     [{"ipBlock": {"cidr": "203.0.113.0/24"}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}]),
    ({"serviceType": "NodePort", "service": {"allowFrom": ["198.51.100.7/32"]}},
     [{"ipBlock": {"cidr": "198.51.100.7/32"}}]),
])
def test_an_exposed_trainer_takes_grpc_from_outside_on_rank_0_alone(trainer, sources):
    objects = _children(_job(trainer={"nodes": 2, **trainer}, security=TLS, generators=SKEWNESS))
    policies = _policies(objects)
    assert set(policies) == {"p-job", "p-trainer-exposed"}
    exposed = policies["p-trainer-exposed"]
    assert kubernetes_validate.validate(exposed, "1.33", strict=True) == "1.33"
    assert exposed["metadata"]["ownerReferences"] == [OWNER]
    selected = exposed["spec"]["podSelector"]["matchLabels"]
    assert selected == {"streamrl.io/job": "p", "streamrl.io/role": "trainer", COMPLETION_INDEX: "0"}
    rule = {"ports": [{"protocol": "TCP", "port": 50051}]}  # gRPC alone: admin stays inside
    if sources:
        rule["from"] = sources
    assert exposed["spec"] == {"podSelector": {"matchLabels": selected}, "policyTypes": ["Ingress"],
                               "ingress": [rule]}
    # it selects the index-0 trainer pod (the Job controller adds the index label) and nothing else
    pods = _pod_labels(objects)
    assert selected.items() <= {**pods["p-trainer"], COMPLETION_INDEX: "0"}.items()
    assert not selected.items() <= {**pods["p-trainer"], COMPLETION_INDEX: "1"}.items()
    for name in ("p-ranker", "p-gen-a", "p-gen-b"):
        assert not selected.items() <= pods[name].items(), name


def test_the_exposed_service_carries_grpc_alone_with_its_annotations_ranges_and_class():
    service = {"annotations": {"networking.gke.io/load-balancer-type": "Internal"},
               "loadBalancerSourceRanges": ["203.0.113.0/24"], "loadBalancerClass": "example.com/lb"}
    objects = {(o["kind"], o["metadata"]["name"]): o for o in _children(
        _job(trainer={"serviceType": "LoadBalancer", "service": service}, security=TLS))}
    front = objects["Service", "p-trainer"]
    assert front["metadata"]["annotations"] == {"networking.gke.io/load-balancer-type": "Internal"}
    assert front["spec"]["type"] == "LoadBalancer"
    assert front["spec"]["ports"] == [{"name": "grpc", "port": 50051, "targetPort": "grpc", "protocol": "TCP"}]
    assert (front["spec"]["loadBalancerSourceRanges"], front["spec"]["loadBalancerClass"]) == (
        ["203.0.113.0/24"], "example.com/lb")
    admin = objects["Service", "p-trainer-admin"]["spec"]
    assert admin["type"] == "ClusterIP"
    assert admin["ports"] == [{"name": "admin", "port": 8080, "targetPort": "admin", "protocol": "TCP"}]
    assert admin["selector"] == front["spec"]["selector"] == {
        "streamrl.io/job": "p", "streamrl.io/role": "trainer", COMPLETION_INDEX: "0"}


# ---- the key tokens derive from -----------------------------------------------------------
class _FakeKube:
    """get: the stored object or None; create: records and stores it (or, with `rival`, stores
    the rival's Secret and answers 409, as when another operator created it first)."""

    def __init__(self, stored: dict | None = None, rival: dict | None = None):
        self.objects: dict[str, dict] = {}
        self.created: list[dict] = []
        self.rival = rival
        if stored:
            self.objects[self._path(stored)] = stored

    @staticmethod
    def _path(obj: dict) -> str:
        meta = obj["metadata"]
        return path_of(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])

    async def get(self, path: str) -> dict | None:
        return self.objects.get(path)

    async def create(self, obj: dict) -> dict:
        self.created.append(obj)
        if self.rival:
            self.objects[self._path(self.rival)] = self.rival
            raise KubeError(409, "secrets already exists", "AlreadyExists")
        self.objects[self._path(obj)] = obj
        return obj


def _key_secret(raw: bytes, settings: Settings = SETTINGS) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": settings.token_key_secret, "namespace": settings.namespace},
            "data": {"key": base64.b64encode(raw).decode()}}


async def test_the_key_is_created_once_random_and_read_back():
    kube = _FakeKube()
    key = await token_key(kube, SETTINGS)
    assert len(key) == 32 and key != bytes(32)
    [created] = kube.created
    assert (created["metadata"]["name"], created["metadata"]["namespace"]) == (
        "streamrl-job-token-key", "streamrl-system")
    assert base64.b64decode(created["data"]["key"]) == key
    assert kubernetes_validate.validate(created, "1.33", strict=True) == "1.33"
    assert await token_key(kube, SETTINGS) == key  # read back, not made again
    assert len(kube.created) == 1
    assert await token_key(_FakeKube(), SETTINGS) != key  # another operator's first key: random


async def test_a_concurrent_creators_key_wins():
    rival = bytes(range(100, 132))
    kube = _FakeKube(rival=_key_secret(rival))
    assert await token_key(kube, SETTINGS) == rival
    assert len(kube.created) == 1


async def test_an_existing_key_is_used_as_it_is():
    kube = _FakeKube(stored=_key_secret(KEY))
    assert await token_key(kube, SETTINGS) == KEY
    assert kube.created == []


@pytest.mark.parametrize("raw", [b"short", b""])
async def test_a_too_short_key_is_refused_naming_its_secret(raw):
    kube = _FakeKube(stored=_key_secret(raw))
    with pytest.raises(ValueError, match="Secret streamrl-system/streamrl-job-token-key: data.key must hold at "
                                         "least 16 bytes"):
        await token_key(kube, SETTINGS)
    assert kube.created == []
