"""The operator's settings: what it knows besides the RLJobs (chart values and flags).
Loaded once, at startup (`load_settings`); nothing reads the environment after that, and
importing any operator module reads none."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

IMAGE, CUDA_IMAGE, IMAGE_PULL_POLICY = "STREAMRL_JOB_IMAGE", "STREAMRL_JOB_CUDA_IMAGE", "STREAMRL_JOB_IMAGE_PULL_POLICY"
IMAGE_PULL_SECRETS = "STREAMRL_JOB_IMAGE_PULL_SECRETS"
NETWORK_POLICY, PROMETHEUS_PEER = "STREAMRL_NETWORK_POLICY", "STREAMRL_NETWORK_POLICY_PROMETHEUS"
TOKEN_KEY_SECRET = "STREAMRL_TOKEN_KEY_SECRET"
PROMETHEUS_URL_ALLOW = "STREAMRL_PROMETHEUS_URL_ALLOW"
TRAINER_BACKOFF_LIMIT = "STREAMRL_TRAINER_BACKOFF_LIMIT"
NAMESPACE = "STREAMRL_OPERATOR_NAMESPACE"
STATUS_INTERVAL_S = "STREAMRL_OPERATOR_STATUS_INTERVAL_S"
PROMETHEUS_URL = "STREAMRL_PROMETHEUS_URL"
METRICS_PORT = "STREAMRL_OPERATOR_METRICS_PORT"
CLUSTER_ID, LEADER_ELECTION = "STREAMRL_CLUSTER_ID", "STREAMRL_LEADER_ELECTION"
POD_IP = "POD_IP"
LABEL_VALUE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


@dataclass(frozen=True)
class Settings:
    """Everything the operator is told at startup (the Helm chart passes most in its
    environment); the defaults are a local run's."""

    image: str = "ghcr.io/streamrl/streamrl:0.1.0"
    """Image of every role on CPU (spec.image overrides it). Env STREAMRL_JOB_IMAGE (chart: jobs.image)."""
    cuda_image: str = "ghcr.io/streamrl/streamrl:0.1.0-cuda"
    """Image of a role whose device is CUDA (the trainer's, a pool's engine's, the ranker's;
    spec.image overrides it). Env STREAMRL_JOB_CUDA_IMAGE (chart: jobs.cudaImage)."""
    image_pull_secrets: tuple[str, ...] = ()
    """Secrets (in the job's namespace, and in a remote pool's cluster) every job pod pulls its
    image with. Env STREAMRL_JOB_IMAGE_PULL_SECRETS, comma-separated (chart: jobs.imagePullSecrets)."""
    image_pull_policy: str = "IfNotPresent"
    """Of every role's container. Env STREAMRL_JOB_IMAGE_PULL_POLICY."""
    trainer_backoff_limit: int = 2
    """Times a failed trainer group is restarted (every pod at once) before the job is Failed.
    Env STREAMRL_TRAINER_BACKOFF_LIMIT."""
    namespace: str = "default"
    """The operator's own namespace (kubeconfig Secrets of RLClusters live there).
    Env STREAMRL_OPERATOR_NAMESPACE."""
    status_interval_s: float = 10.0
    """How often each RLJob's status is refreshed from its children and its trainer, and how
    long the autoscaler waits after a failed API call. Env STREAMRL_OPERATOR_STATUS_INTERVAL_S."""
    prometheus_url: str = ""
    """The Prometheus HTTP API autoscaled jobs read unless they name their own ("" = none).
    Flag --prometheus-url, env STREAMRL_PROMETHEUS_URL."""
    prometheus_url_allow: tuple[str, ...] = ()
    """URL prefixes a job's own spec.autoscaling.prometheusUrl must start with (the operator
    fetches it from its own place in the network); empty: a job may name none, only the
    operator's URL is read. Env STREAMRL_PROMETHEUS_URL_ALLOW, comma-separated (chart:
    operator.prometheusUrlAllow)."""
    health_port: int = 8080
    """Port of the /healthz liveness endpoint. Flag --health-port."""
    metrics_port: int = 8081
    """Port of the autoscaler's Prometheus /metrics (0 = none). Flag --metrics-port, env
    STREAMRL_OPERATOR_METRICS_PORT."""
    listen_host: str = "0.0.0.0"
    """Where /healthz and /metrics listen: `::` in a pod whose IP is IPv6 (env POD_IP: an
    IPv6-only cluster, or a dual-stack one with IPv6 first, whose kubelet probes that IP),
    else every IPv4 address."""
    watch_namespaces: tuple[str, ...] = ()
    """Namespaces whose RLJobs the operator manages (empty = all). Flag --namespace."""
    network_policy: bool = True
    """A NetworkPolicy around every job: only its own pods, the operator's namespace and
    Prometheus reach its ports. Env STREAMRL_NETWORK_POLICY (true|false; chart: networkPolicy.enabled)."""
    prometheus_peer: dict | None = None
    """The NetworkPolicy peer (namespaceSelector and/or podSelector) Prometheus scrapes job pods
    from; None = no scraping allowed. Env STREAMRL_NETWORK_POLICY_PROMETHEUS, JSON (chart:
    networkPolicy.prometheus)."""
    cluster_id: str = ""
    """This cluster's name in the origin labels of the objects it puts in other clusters, and in
    every job token's derivation: two home clusters sharing a remote one must differ. "" = the
    uid of this cluster's kube-system namespace, read at startup. Env STREAMRL_CLUSTER_ID
    (chart: clusterId)."""
    leader_election: bool = True
    """Whether the operator reconciles only while it holds the Lease streamrl-operator in its
    namespace (so several replicas never both reconcile). Env STREAMRL_LEADER_ELECTION."""
    token_key_secret: str = "streamrl-job-token-key"
    """The Secret, in the operator's namespace, holding the key every job's token is derived
    from (the operator creates it when missing). Env STREAMRL_TOKEN_KEY_SECRET."""


def _checked(what: str, raw: str, kind: Callable[[str], T], ok: Callable[[T], bool], expected: str) -> T:
    """`raw` as `kind`, when `ok`; else ValueError naming `what` and what it must be."""
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise ValueError(f"{what} must be {expected}, got {raw!r}")
    return value


def _is_port(v: int) -> bool:
    return 0 <= v <= 65535


_PORT_RANGE = "a port number in 0..65535"


def _port(what: str, raw: str) -> int:
    return _checked(what, raw, int, _is_port, _PORT_RANGE)


_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _secret_names(raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    if not all(_SECRET_NAME.match(n) and len(n) <= 253 for n in names):
        raise ValueError
    return names


def _url_prefixes(raw: str) -> tuple[str, ...]:
    prefixes = tuple(p.strip() for p in raw.split(",") if p.strip())
    if not all(p.startswith(("http://", "https://")) for p in prefixes):
        raise ValueError
    return prefixes


def _peer(raw: str) -> dict | None:
    """A NetworkPolicyPeer with a namespaceSelector and/or a podSelector, from JSON ("" or {} = none)."""
    peer = json.loads(raw)
    if not isinstance(peer, dict) or not set(peer) <= {"namespaceSelector", "podSelector"} or not all(
            isinstance(v, dict) for v in peer.values()):
        raise ValueError
    return peer or None


def load_settings(environ: Mapping[str, str], *, namespaces: list[str] | tuple[str, ...] = (),
                  health_port: int | None = None, metrics_port: int | None = None,
                  prometheus_url: str | None = None) -> Settings:
    """The settings from the command line's flags (None = not given), else the environment
    (unset or empty = the default). ValueError naming the flag or variable and the problem."""
    d = Settings()

    def env(name: str, kind: Callable[[str], T], ok: Callable[[T], bool], expected: str, default: T) -> T:
        raw = environ.get(name)
        return _checked(name, raw, kind, ok, expected) if raw else default

    if prometheus_url is None:
        prometheus_url = environ.get(PROMETHEUS_URL, "")
    if prometheus_url:
        _checked(f"--prometheus-url ({PROMETHEUS_URL})", prometheus_url, str,
                 lambda v: v.startswith(("http://", "https://")), "an http:// or https:// URL")
    return Settings(
        image=environ.get(IMAGE) or d.image,
        cuda_image=environ.get(CUDA_IMAGE) or d.cuda_image,
        image_pull_secrets=env(IMAGE_PULL_SECRETS, _secret_names, lambda v: True,
                               "Secret names separated by commas", d.image_pull_secrets),
        network_policy=env(NETWORK_POLICY, str.lower, lambda v: v in ("true", "false"), "true or false",
                           "true") == "true",
        prometheus_peer=env(PROMETHEUS_PEER, _peer, lambda v: True,
                            'JSON of a NetworkPolicy peer ({"namespaceSelector": {...}, "podSelector": {...}})',
                            d.prometheus_peer),
        token_key_secret=environ.get(TOKEN_KEY_SECRET) or d.token_key_secret,
        cluster_id=env(CLUSTER_ID, str, lambda v: bool(LABEL_VALUE.match(v)),
                       "a label value (letters, digits, '-', '_', '.'; at most 63)", d.cluster_id),
        leader_election=env(LEADER_ELECTION, str.lower, lambda v: v in ("true", "false"), "true or false",
                            "true") == "true",
        prometheus_url_allow=env(PROMETHEUS_URL_ALLOW, _url_prefixes, lambda v: True,
                                 "http:// or https:// URL prefixes separated by commas", d.prometheus_url_allow),
        image_pull_policy=env(IMAGE_PULL_POLICY, str, lambda v: v in PULL_POLICIES,
                              "one of " + ", ".join(PULL_POLICIES), d.image_pull_policy),
        trainer_backoff_limit=env(TRAINER_BACKOFF_LIMIT, int, lambda v: v >= 0, "an integer >= 0",
                                  d.trainer_backoff_limit),
        namespace=environ.get(NAMESPACE) or d.namespace,
        status_interval_s=env(STATUS_INTERVAL_S, float, lambda v: 0 < v < math.inf, "a number of seconds > 0",
                              d.status_interval_s),
        prometheus_url=prometheus_url,
        health_port=d.health_port if health_port is None else _port("--health-port", str(health_port)),
        metrics_port=_port(f"--metrics-port ({METRICS_PORT})", str(metrics_port)) if metrics_port is not None
        else env(METRICS_PORT, int, _is_port, _PORT_RANGE, d.metrics_port),
        watch_namespaces=tuple(namespaces),
        listen_host="::" if ":" in (environ.get(POD_IP) or "") else d.listen_host,
    )
