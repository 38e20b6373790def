"""A generator's weight fetches: the versions its trainer announces, pulled in the background
(from a pool peer when told, else from the trainer), verified, offered to its relay and
handed to the engine thread. Tracks the newest version the trainer on the live stream
publishes (the engine holds work while it is ahead of it). Knows nothing of the stream."""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Callable

import grpc

from streamrl.generator.engine import Engine
from streamrl.generator.relay import Incoming, Relay
from streamrl.generator.worker import LoadWeights, TrainerVersion
from streamrl.messages import WeightsNotice
from streamrl.metrics import ServiceMetrics
from streamrl.spec import SecuritySpec
from streamrl.weights import WeightsCorruptError, deserialize
from streamrl.wire.channels import open_channel
from streamrl.wire.transfer import WeightSource, fetch_blob

log = logging.getLogger("streamrl.generator")


def _after(offset: int, add: Callable[[int, memoryview, str], None]) -> Callable[[int, memoryview, str], None]:
    """`add` for the chunks past `offset` (a fetch that starts over from 0 after a peer failed)."""

    def relay(at: int, data: memoryview, sha256: str) -> None:
        if at >= offset:
            add(at, data, sha256)

    return relay


class WeightFetcher:
    def __init__(self, engine: Engine, inbox: queue.Queue, metrics: ServiceMetrics, relay: Relay | None,
                 security: SecuritySpec, stopping: asyncio.Event):
        self.engine, self.inbox, self.metrics, self.relay, self.security = engine, inbox, metrics, relay, security
        self.stopping = stopping
        """Set when the replica leaves: a failed fetch then says nothing."""
        self.fetching: set[int] = set()
        """Versions being fetched."""
        self.tasks: set[asyncio.Task] = set()
        self.trainer_version = 0
        """The newest version the trainer on the live stream publishes, as far as it has said."""
        self.source: WeightSource | None = None
        """The live stream's trainer (set as each stream opens)."""
        self.sha256: dict[int, str] = {}
        """The published SHA-256 of each version fetched (the initial model has none)."""

    def welcome(self, policy_version: int) -> None:
        """A trainer welcomed the replica: it publishes `policy_version`."""
        self.trainer_version = policy_version
        self.inbox.put(TrainerVersion(policy_version))

    def notice(self, notice: WeightsNotice) -> None:
        """Fetch a version the trainer announced unless it is held or older than one it
        announced already; one older than the held version is a rollback (the trainer resumed
        from an earlier version than this replica last loaded)."""
        version = notice.policy_version
        if version < self.trainer_version or version in self.fetching:
            return
        if version > self.trainer_version:
            self.trainer_version = version
            self.inbox.put(TrainerVersion(version))
        held = self.engine.policy_version
        replace = version == held and self.sha256.get(version, notice.sha256) != notice.sha256
        if version == held and not replace and self.engine.holds_weights:
            return
        if replace:
            log.warning("the trainer publishes v%d with other weights than those held (an earlier start of a resumed "
                        "trainer published them): fetching its own", version)
        self.fetching.add(version)
        assert self.source is not None  # the stream that announced it set it
        task = asyncio.create_task(self._fetch_and_load(notice, self.source, time.monotonic(), version < held, replace),
                                   name=f"fetch-v{version}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def cancel(self) -> None:
        """Abandon every fetch (the stream that announced them broke)."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _fetch(self, notice: WeightsNotice, source: WeightSource, incoming: Incoming | None) -> tuple[bytes, str]:
        """The version's bytes from the named peer, or from the trainer when there is none
        or it fails; returns (blob, "peer" | "trainer"). Each verified chunk goes to
        `incoming` (this replica's relay serves it to its own peers as it arrives)."""
        relayed = incoming.add if incoming is not None else None
        if notice.source:
            peer_name = self.security.tls.generator_server_name if self.security.tls else None
            channel = open_channel(notice.source, self.security, server_name=peer_name)  # a generator, not the trainer
            try:
                return await fetch_blob(WeightSource(channel), notice, max_attempts=2, stopping=self.stopping,
                                        on_chunk=relayed), "peer"
            except grpc.aio.AioRpcError as err:
                if self.stopping.is_set():
                    raise
                log.warning("peer %s could not serve v%d (%s); fetching from the trainer", notice.source,
                            notice.policy_version, err.code().name)
            finally:
                await channel.close()
            if incoming is not None and incoming.chunks:  # resumes where the peer left off
                relayed = _after(incoming.received, incoming.add)
        return await fetch_blob(source, notice, stopping=self.stopping, on_chunk=relayed), "trainer"

    def held_sha256(self) -> str:
        """SHA-256 of the weights the engine holds as they were published ("": the initial model)."""
        return self.sha256.get(self.engine.policy_version, "")

    async def _fetch_and_load(self, notice: WeightsNotice, source: WeightSource, t0: float, rollback: bool,
                              replace: bool = False) -> None:
        incoming = self.relay.begin(notice) if self.relay else None
        blob = None
        try:
            blob, where = await self._fetch(notice, source, incoming)
            if self.relay and incoming is not None:  # incoming: begun with the relay
                await self.relay.end(incoming, blob)
            self.metrics.weight_sync_bytes.labels(where).inc(len(blob))
            self.metrics.weight_fetch_seconds.labels(where).observe(time.monotonic() - t0)
            tensors = await asyncio.to_thread(deserialize, blob)
            self.sha256[notice.policy_version] = notice.sha256
            self.inbox.put(LoadWeights(notice.policy_version, tensors, t0, len(blob), where, rollback, replace))
        except (WeightsCorruptError, grpc.aio.AioRpcError) as err:
            if not self.stopping.is_set():
                log.error("weights v%d rejected, keeping v%d: %s", notice.policy_version,
                          self.engine.policy_version, err)
        finally:
            if self.relay and incoming is not None and blob is None:  # peers being served fetch from the trainer
                await self.relay.end(incoming, None)
            self.fetching.discard(notice.policy_version)
