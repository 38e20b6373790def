"""The operator's state between handler calls, kept in kopf's memo: the API clients, the
settings, what it remembers per RLJob and RLCluster. Knows no handler and no phase."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from streamrl.metrics import AutoscalerMetrics
from streamrl.operator.kube import KubeClient
from streamrl.operator.observe import fetch_trainer_status
from streamrl.operator.scaling import Memory
from streamrl.operator.settings import Settings


@dataclass
class Runtime:
    """Everything the handlers do I/O with, and what they remember."""

    kube: KubeClient
    """This cluster's API server."""
    settings: Settings = field(default_factory=Settings)
    clusters: dict[str, KubeClient] = field(default_factory=dict)
    """Registered remote clusters by RLCluster name, once their kubeconfig checked out."""
    allowed_namespaces: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per registered cluster: the namespaces whose RLJobs may place pools there ("*": any)."""
    kubernetes_version: str = "1.33"
    """The API server's minor version (reconcile.schema_version): children are checked against its schemas."""
    cluster_id: str = "home"
    """This cluster's name in origin labels of remote objects."""
    trainer_status: Callable[[str, str], Awaitable[dict | None]] = fetch_trainer_status
    """(job, namespace) -> the trainer's /status body as JSON, None while it cannot be reached."""
    retry_delay_s: float = 15.0
    """Before trying again what waits on another party (a cluster, a load balancer)."""
    metrics: AutoscalerMetrics = field(default_factory=AutoscalerMetrics)
    """The autoscaler's series, served on the operator's metrics port."""
    scaling: dict[str, Memory] = field(default_factory=dict)
    """The autoscaler's memory per RLJob ("namespace/name")."""
    unreadable: dict[str, str] = field(default_factory=dict)
    """Per RLJob ("namespace/name"): why its trainer's last /status did not parse (a
    warning is logged when this changes, not on every refresh)."""
    resumed: dict[str, int] = field(default_factory=dict)
    """Per RLJob ("namespace/name"): the trainer start (incarnation) a Resumed Event was last
    posted for (with status.trainer.incarnation, so each start is announced once)."""
    applied: dict[str, dict[tuple[str, str], tuple[str, str]]] = field(default_factory=dict)
    """Per RLJob ("namespace/name"), per (cluster, API path): (digest of the object last applied,
    the resourceVersion it came back with). Equal to what is built and found: nothing to write."""
    pruned: dict = field(default_factory=dict)
    """Per RLJob (and per RLJob and cluster): the desired set the last prune was done for."""
    children: dict[str, dict | None] = field(default_factory=dict)
    """This cluster's children of RLJobs as the watch last saw them (or the operator last wrote
    them), by API path; None: seen deleted. Read instead of a GET per child per round."""
    resynced: dict[str, float] = field(default_factory=dict)
    """Per RLJob: when (time.monotonic) its children were last read from the API server
    rather than from `children` (a watch can miss an event; a resync repairs that)."""
    settled: dict[str, float] = field(default_factory=dict)
    """Per finished RLJob: when (time.monotonic) it was last reconciled (finished jobs are
    looked at again only every FINISHED_RESYNC_S)."""
    cluster_digests: dict[str, str] = field(default_factory=dict)
    """Per registered cluster: a digest of its kubeconfig and allowed namespaces (unchanged: its
    client is kept, not replaced, by the next probe)."""
    cluster_reviewed: dict[str, float] = field(default_factory=dict)
    """Per registered cluster: when (time.monotonic) its permissions were last checked."""
    client_grace_s: float = 30.0
    """How long a replaced remote client stays open for the requests still in flight on it."""
    retiring: set[asyncio.Task] = field(default_factory=set)
    """Replaced remote clients waiting out client_grace_s before they close (referenced until then)."""
    queued: set[str] = field(default_factory=set)
    """RLJobs ("namespace/name") whose trainer Job Kueue took without their label (its
    LocalQueue defaulting, manageJobsWithoutQueueName): suspended, they get no Job at all (Kueue
    would admit one), as a job with the label."""
    token_key: bytes | None = None
    """The key job tokens derive from (perimeter.token_key), once read."""
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    """Per RLJob: held by each reconcile, so the spec handler and the timer never interleave."""

    def lock(self, key: str) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def forget(self, key: str) -> None:
        """Drop what is kept for an RLJob ("namespace/name") that is gone."""
        for memory in (self.scaling, self.unreadable, self.resumed, self.applied, self.locks, self.resynced,
                       self.settled):
            memory.pop(key, None)
        self.queued.discard(key)
        for k in [k for k in self.pruned if k == key or (isinstance(k, tuple) and k[0] == key)]:
            del self.pruned[k]

    def cluster_allows(self, cluster: str, namespace: str) -> bool:
        allowed = self.allowed_namespaces.get(cluster, ())
        return "*" in allowed or namespace in allowed
