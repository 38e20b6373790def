"""Which replica fetches a new weight version from where. In a relay pool one replica (the
seed) fetches it from the trainer and its pool peers fetch it from the seed at once: the seed
serves each chunk as soon as it has verified it (cut-through, services/generator/relay.py), so
one copy crosses the link to a pool and the pool holds the version about one transfer after
the notice, not two. Records how each version reached the replicas."""

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

    def _source(self, replica: Replica, policy_version: int, replicas: Iterable[Replica]) -> str:
        """Where `replica` fetches the version: in a relay pool, a peer that holds it, else a
        peer fetching it from the trainer (it relays each chunk as it arrives); "" = the trainer.
        A peer booting without weights is a source only once it holds them."""
        if replica.pool not in self.relay_pools:
            return ""
        seed = ""
        for r in replicas:
            if r is replica or r.pool != replica.pool or not r.weights_address:
                continue
            if r.policy_version == policy_version and not r.without_weights and r.told is None:
                return r.weights_address
            if r.told == (policy_version, "") and not seed:
                seed = r.weights_address
        return seed

    def _tell(self, replica: Replica, notice: WeightsNotice, source: str) -> None:
        replica.told = (notice.policy_version, source)
        replica.outbox.put_nowait(replace(notice, source=source))

    def joined(self, replica: Replica, replicas: Iterable[Replica]) -> None:
        """A new replica that holds another version, or none (it booted from the trainer), is
        told to fetch the latest; so is one that holds the latest version number with other
        weights (an earlier start of a resumed trainer published it). In a relay pool, from a
        peer that holds it or is fetching it (replicas booting together take one copy from the
        trainer, relayed through the first of them)."""
        latest = self.latest
        other_weights = bool(replica.weights_sha256) and replica.weights_sha256 != (latest.sha256 if latest else "")
        if not latest or not (replica.without_weights or latest.policy_version != replica.policy_version
                              or other_weights):
            return
        self._tell(replica, latest, self._source(replica, latest.policy_version, replicas))

    def announce(self, notice: WeightsNotice, replicas: Iterable[Replica]) -> None:
        """Tell every replica about a new version: in a relay pool the first replica that
        relays (the seed) fetches it from the trainer, the others from the seed, at once."""
        self.latest = notice
        seeds: dict[str, str] = {}
        for r in replicas:
            source = seeds.get(r.pool, "") if r.pool in self.relay_pools else ""
            if r.pool in self.relay_pools and not source and r.weights_address:
                seeds[r.pool] = r.weights_address
            self._tell(r, notice, source)

    def loaded(self, loader: Replica, msg: WeightsLoaded, replicas: Iterable[Replica]) -> None:
        """A replica swapped in a version: record it (it is now a source of that version)."""
        self._syncs.setdefault(msg.policy_version, {})[loader.generator_id] = msg
        self.bytes_by_source[msg.source] = self.bytes_by_source.get(msg.source, 0) + msg.size_bytes
        while len(self._syncs) > KEEP_VERSIONS:
            del self._syncs[min(self._syncs)]
        loader.policy_version = msg.policy_version
        loader.without_weights = False
        if loader.told is not None and loader.told[0] <= msg.policy_version:
            loader.told = None

    def left(self, gone: Replica, replicas: list[Replica]) -> None:
        """A replica left: its pool peers still fetching the latest version from it are told
        another source (a peer that holds or fetches it, else the trainer; a replica already
        fetching keeps its own fallback, the trainer)."""
        latest = self.latest
        if latest is None or not gone.weights_address:
            return
        for r in replicas:
            if r.pool == gone.pool and r.told == (latest.policy_version, gone.weights_address):
                r.told = None
                self._tell(r, latest, self._source(r, latest.policy_version, replicas))

    def version_sync(self, policy_version: int) -> VersionSync:
        syncs = self._syncs.get(policy_version, {}).values()
        return VersionSync(max((s.sync_s for s in syncs), default=0.0),
                           sum(s.size_bytes for s in syncs if s.source == "trainer"),
                           sum(s.size_bytes for s in syncs if s.source == "peer"))
