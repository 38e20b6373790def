"""The operator's state between handler calls, kept in kopf's memo: the API clients, the
settings, what it remembers per RLJob and RLCluster. Knows no handler and no phase."""

from __future__ import annotations

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
