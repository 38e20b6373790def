"""A generator's in-pool relay: the weight versions it holds, served to its pool peers over
FetchWeights (so a remote pool receives one copy over the slow link). Cut-through: a version
it is still fetching from the trainer is served too, each chunk as soon as it is verified, so
its peers finish about when it does. Runs on the replica's gRPC server (the service shell's)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from streamrl.messages import WeightsNotice
from streamrl.weights import WeightStore, WeightVersion
from streamrl.wire.codec import encode_chunk
from streamrl.wire.transfer import rollout_handler, serve_version

ARRIVAL_WAIT_S = 10.0
"""How long a peer's request for a version this replica has not begun to fetch waits for it
(the trainer tells the seed and its peers at once; the peer may dial first)."""


class Incoming:
    """A version on its way in: its verified chunks so far, served while more arrive. Changed
    on the event loop's thread only."""

    def __init__(self, notice: WeightsNotice):
        self.policy_version = notice.policy_version
        self.size_bytes = notice.size_bytes
        self.sha256 = notice.sha256
        self.chunks: list[tuple[int, memoryview, str]] = []
        self.received = 0
        self.failed = False
        self._changed = asyncio.Event()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def add(self, offset: int, data: memoryview, sha256: str) -> None:
        """The next verified chunk."""
        self.chunks.append((offset, data, sha256))
        self.received = offset + len(data)
        self._wake()

    def fail(self) -> None:
        self.failed = True
        self._wake()

    def version(self, blob: bytes) -> WeightVersion | None:
        """The held version from the chunks' digests (no second hashing pass), when they have
        the uniform size a WeightVersion serves (the last may be shorter); else None."""
        sizes = [len(data) for _, data, _ in self.chunks]
        if not sizes or any(n != sizes[0] for n in sizes[:-1]) or sizes[-1] > sizes[0]:
            return None
        return WeightVersion(self.policy_version, blob, sizes[0], self.sha256, tuple(sha for _, _, sha in self.chunks))

    async def responses(self, offset_bytes: int, context) -> AsyncIterator[bytes]:
        """Encoded chunks from offset_bytes (a chunk boundary) as they arrive; aborts the call
        UNAVAILABLE when the fetch fails (the peer then fetches from the trainer)."""
        i, started = 0, False
        while True:
            while i >= len(self.chunks) and not self.failed and self.received < self.size_bytes:
                await self._changed.wait()
            if self.failed:
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"the relay's own fetch of weight version {self.policy_version} failed")
            while i < len(self.chunks):
                offset, data, sha = self.chunks[i]
                i += 1
                if offset + len(data) <= offset_bytes and offset_bytes:
                    continue
                if not started and offset != offset_bytes:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"offset_bytes {offset_bytes} is not a "
                                                                          f"chunk boundary of version "
                                                                          f"{self.policy_version}")
                started = True
                yield encode_chunk(self, offset, data, sha)
            if self.received >= self.size_bytes:
                return


class Relay:
    def __init__(self, keep: int, chunk_bytes: int):
        self.store = WeightStore(keep, chunk_bytes)
        self.address = ""
        """host:port peers dial; set once its server listens."""
        self.bytes_served = 0
        self.incoming: dict[int, Incoming] = {}
        """Versions being fetched, served as they arrive."""
        self._begun = asyncio.Event()

    def begin(self, notice: WeightsNotice) -> Incoming:
        """A fetch of `notice`'s version starts: peers asking for it are served as it arrives."""
        incoming = self.incoming[notice.policy_version] = Incoming(notice)
        self._begun.set()
        self._begun = asyncio.Event()
        return incoming

    async def end(self, incoming: Incoming, blob: bytes | None) -> None:
        """The fetch ended: with the version's verified bytes (held from now on), or failed
        (peers being served are cut off and fetch from the trainer)."""
        if blob is not None:
            version = incoming.version(blob)
            if version is None:
                version = await asyncio.to_thread(WeightVersion.build, incoming.policy_version, blob,
                                                  self.store.chunk_bytes)
            self.hold(version)
        if blob is None:
            incoming.fail()
        if self.incoming.get(incoming.policy_version) is incoming:
            del self.incoming[incoming.policy_version]

    def hold(self, version: WeightVersion) -> None:
        self.store.add(version)

    def forget(self) -> None:
        """Drop every version held (the trainer restarted: its versions may differ from these)."""
        self.store = WeightStore(self.store.keep, self.store.chunk_bytes)

    def handler(self) -> grpc.GenericRpcHandler:
        return rollout_handler(self.Connect, self.FetchWeights)

    async def _arriving(self, policy_version: int) -> WeightVersion | Incoming | None:
        """The version held, or on its way in (waiting ARRIVAL_WAIT_S for its fetch to begin)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ARRIVAL_WAIT_S
        while True:
            held = self.store.get(policy_version)
            if held is not None:
                return held
            if policy_version in self.incoming:
                return self.incoming[policy_version]
            if policy_version < max([*self.incoming, self.store.latest.policy_version if self.store.latest else -1]):
                return None  # an older version this relay will not fetch
            begun = self._begun
            try:
                await asyncio.wait_for(begun.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return self.store.get(policy_version) or self.incoming.get(policy_version)

    async def FetchWeights(self, request, context):
        source = await self._arriving(request.policy_version)
        if isinstance(source, Incoming):
            responses = source.responses(request.offset_bytes, context)
        else:
            responses = serve_version(source, request, context, " here")
        async for response in responses:
            self.bytes_served += len(response)
            yield response

    async def Connect(self, request_iterator, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "a generator relays weights only; dial the trainer")
