"""Which replica fetches a new weight version from where: in a relay pool one replica (the
seed) fetches it from the trainer and its pool peers fetch it from the seed once it holds
it, so one copy crosses the link to a pool. Records how each version reached the replicas."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from streamrl.messages import WeightsLoaded, WeightsNotice
from streamrl.rollout.replica import Replica

KEEP_VERSIONS = 8
"""Versions whose per-replica syncs are kept (an iteration reads its own starting version's)."""


@dataclass(frozen=True)
class VersionSync:
    """How one version reached the replicas that reported so far."""

    sync_s_max: float = 0.0
    """Slowest replica's seconds from notice to swap."""
    bytes_from_trainer: int = 0
    bytes_from_peers: int = 0


class WeightRelay:
    def __init__(self, relay_pools: frozenset[str] = frozenset()):
        self.relay_pools = relay_pools
        self.latest: WeightsNotice | None = None
        self._syncs: dict[int, dict[str, WeightsLoaded]] = {}
        """policy_version -> generator_id -> its WeightsLoaded."""
        self.bytes_by_source: dict[str, int] = {}
        """Weight bytes the replicas received, by source (trainer|peer|local), whole run."""

    def _holder(self, replica: Replica, policy_version: int, replicas: Iterable[Replica]) -> str:
        """A pool peer of `replica` that holds the version and relays it; "" = the trainer."""
        if replica.pool not in self.relay_pools:
            return ""
        for r in replicas:
            if r is not replica and r.pool == replica.pool and r.weights_address and \
                    r.policy_version == policy_version and not r.without_weights:
                return r.weights_address
        return ""

    def joined(self, replica: Replica, replicas: Iterable[Replica]) -> None:
        """A new replica that holds another version, or none (it booted from the trainer), is
        told to fetch the latest; so is one that holds the latest version number with other
        weights (an earlier start of a resumed trainer published it). In a relay pool, from a
        peer that holds it; when none does yet but one is fetching it, once that one holds it
        (replicas booting together fetch one copy from the trainer, then from each other)."""
        latest = self.latest
        other_weights = bool(replica.weights_sha256) and replica.weights_sha256 != (latest.sha256 if latest else "")
        if not latest or not (replica.without_weights or latest.policy_version != replica.policy_version
                              or other_weights):
            return
        source = self._holder(replica, latest.policy_version, replicas)
        if not source and replica.pool in self.relay_pools and replica.weights_address and any(
                r is not replica and r.pool == replica.pool and r.weights_address and r.awaiting_weights is None
                and (r.without_weights or r.policy_version != latest.policy_version) for r in replicas):
            replica.awaiting_weights = latest.policy_version  # a peer fetches it: told once that one holds it
            return
        replica.outbox.put_nowait(replace(latest, source=source))

    def announce(self, notice: WeightsNotice, replicas: Iterable[Replica]) -> None:
        """Tell every replica about a new version; in a relay pool only the seed fetches it
        from the trainer, the others wait until it holds the version."""
        self.latest = notice
        seeded: set[str] = set()
        for r in replicas:
            if r.pool in self.relay_pools and r.weights_address:
                if r.pool in seeded:
                    r.awaiting_weights = notice.policy_version
                    continue
                seeded.add(r.pool)
            r.awaiting_weights = None
            r.outbox.put_nowait(notice)

    def loaded(self, loader: Replica, msg: WeightsLoaded, replicas: Iterable[Replica]) -> None:
        """A replica swapped in a version: record it, and let its pool peers waiting for the
        version fetch it from this replica."""
        self._syncs.setdefault(msg.policy_version, {})[loader.generator_id] = msg
        self.bytes_by_source[msg.source] = self.bytes_by_source.get(msg.source, 0) + msg.size_bytes
        while len(self._syncs) > KEEP_VERSIONS:
            del self._syncs[min(self._syncs)]
        loader.policy_version = msg.policy_version
        loader.without_weights = False
        if loader.awaiting_weights is not None and loader.awaiting_weights <= msg.policy_version:
            loader.awaiting_weights = None
        latest = self.latest
        if latest is None or latest.policy_version != msg.policy_version or not loader.weights_address:
            return
        for r in replicas:
            if r.pool == loader.pool and r.awaiting_weights == msg.policy_version:
                r.awaiting_weights = None
                r.outbox.put_nowait(replace(latest, source=loader.weights_address))

    def left(self, pool: str, replicas: list[Replica]) -> None:
        """The pool's seed may have left before its peers were told where to fetch: appoint another."""
        latest = self.latest
        waiting = [r for r in replicas if r.pool == pool and r.awaiting_weights is not None]
        if not waiting or latest is None:
            return
        fetching = any(r.pool == pool and r.awaiting_weights is None
                       and (r.without_weights or r.policy_version != latest.policy_version) for r in replicas)
        if not fetching:
            seed = waiting[0]
            seed.awaiting_weights = None
            seed.outbox.put_nowait(replace(latest, source=self._holder(seed, latest.policy_version, replicas)))

    def version_sync(self, policy_version: int) -> VersionSync:
        syncs = self._syncs.get(policy_version, {}).values()
        return VersionSync(max((s.sync_s for s in syncs), default=0.0),
                           sum(s.size_bytes for s in syncs if s.source == "trainer"),
                           sum(s.size_bytes for s in syncs if s.source == "peer"))
