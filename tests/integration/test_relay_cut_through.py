"""A generator's relay serves a version while it is still arriving (cut-through), over real
gRPC: a peer gets each chunk once the relay has it and waits for the next; the held version is
built from the chunks' digests; a fetch that fails cuts the peers off (UNAVAILABLE: they fetch
from the trainer); a peer that dials before the relay's own fetch begins is served when it
does; a version older than the relay's newest is not waited for."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from streamrl.generator.relay import Relay
from streamrl.messages import WeightsNotice
from streamrl.weights import WeightStore
from streamrl.wire.transfer import WeightSource
from tests.integration.inproc import RelayThread

CHUNK = 4096


def _version(policy_version: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    version = WeightStore(1, CHUNK).publish(policy_version, {"w": torch.randn(10_000, generator=g)})
    return version, WeightsNotice(policy_version, version.size_bytes, version.num_chunks, version.sha256)


@pytest.fixture
def relay():
    thread = RelayThread(Relay(2, CHUNK))
    yield thread
    thread.stop()


def _on_relay(relay: RelayThread, fn, *args):
    """Run fn(*args) on the relay's loop (Incoming and Relay change there only), from a coroutine."""

    async def call():
        return fn(*args)

    return asyncio.to_thread(relay.call, call())


async def _next(stream, timeout_s: float = 5.0):
    return await asyncio.wait_for(stream.__anext__(), timeout_s)


def test_a_peer_gets_each_chunk_while_the_version_arrives(relay):
    version, notice = _version(3, 0)
    chunks = list(version.chunks())
    half = len(chunks) // 2

    async def go():
        incoming = await _on_relay(relay, relay.relay.begin, notice)
        async with grpc.aio.insecure_channel(relay.relay.address) as channel:
            stream = WeightSource(channel).fetch(3, 0).__aiter__()
            for chunk in chunks[:half]:
                await _on_relay(relay, incoming.add, *chunk)
            got = [await _next(stream) for _ in range(half)]
            assert [c.offset_bytes for c in got] == [offset for offset, _, _ in chunks[:half]]
            pending = asyncio.ensure_future(_next(stream))
            await asyncio.sleep(0.3)
            assert not pending.done()  # nothing past what the relay holds
            for chunk in chunks[half:]:
                await _on_relay(relay, incoming.add, *chunk)
            await asyncio.to_thread(relay.call, relay.relay.end(incoming, version.blob))
            got += [await pending] + [c async for c in stream]
        assert b"".join(bytes(c.data) for c in got) == version.blob
        assert [c.sha256 for c in got] == list(version.chunk_sha256)
        held = relay.relay.store.get(3)
        assert held is not None and held.chunk_sha256 == version.chunk_sha256 and held.sha256 == version.sha256
        assert 3 not in relay.relay.incoming

    asyncio.run(go())


def test_a_failed_fetch_cuts_its_peers_off_so_they_fetch_from_the_trainer(relay):
    version, notice = _version(4, 1)
    chunks = list(version.chunks())

    async def go():
        incoming = await _on_relay(relay, relay.relay.begin, notice)
        for chunk in chunks[:3]:
            await _on_relay(relay, incoming.add, *chunk)
        async with grpc.aio.insecure_channel(relay.relay.address) as channel:
            stream = WeightSource(channel).fetch(4, 0).__aiter__()
            assert [(await _next(stream)).offset_bytes for _ in range(3)] == [0, CHUNK, 2 * CHUNK]
            await asyncio.to_thread(relay.call, relay.relay.end(incoming, None))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _next(stream)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "fetch of weight version 4 failed" in err.value.details()
        assert relay.relay.store.get(4) is None

    asyncio.run(go())


def test_a_peer_that_dials_first_is_served_once_the_fetch_begins_and_an_older_version_is_not_waited_for(relay):
    version, notice = _version(6, 2)

    async def go():
        async with grpc.aio.insecure_channel(relay.relay.address) as channel:
            stream = WeightSource(channel).fetch(6, 0).__aiter__()
            first = asyncio.ensure_future(_next(stream))
            await asyncio.sleep(0.3)
            assert not first.done()  # waiting for the relay's own fetch to begin
            incoming = await _on_relay(relay, relay.relay.begin, notice)
            for chunk in version.chunks():
                await _on_relay(relay, incoming.add, *chunk)
            got = [await first] + [c async for c in stream]
            assert b"".join(bytes(c.data) for c in got) == version.blob
            with pytest.raises(grpc.aio.AioRpcError) as err:  # older than v6, which is on its way
                await _next(WeightSource(channel).fetch(5, 0).__aiter__())
            assert err.value.code() == grpc.StatusCode.NOT_FOUND

    asyncio.run(go())
