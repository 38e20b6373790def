"""Weight transfer over gRPC (asyncio): serving a held version as FetchWeights chunks, and
fetching one with resume from the last verified chunk. Used by the trainer, by generators
fetching, and by generators relaying to their pool peers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from concurrent import futures

import grpc

from streamrl.messages import WeightsNotice
from streamrl.v1 import rollout_pb2 as pb
from streamrl.weights import WeightAssembler, WeightsCorruptError, WeightVersion
from streamrl.wire.codec import Chunk, decode_chunk, encode_chunk

log = logging.getLogger(__name__)

FETCH_WEIGHTS = "/streamrl.v1.Rollout/FetchWeights"


class WeightSource:
    """The client side of FetchWeights on a channel; chunks are decoded without copies."""

    def __init__(self, channel: grpc.aio.Channel):
        self._call = channel.unary_stream(FETCH_WEIGHTS, request_serializer=pb.FetchWeightsRequest.SerializeToString,
                                          response_deserializer=decode_chunk)

    def fetch(self, policy_version: int, offset_bytes: int) -> AsyncIterable[Chunk]:
        return self._call(pb.FetchWeightsRequest(policy_version=policy_version, offset_bytes=offset_bytes))


async def fetch_blob(source: WeightSource, notice: WeightsNotice, max_attempts: int = 5, backoff_s: float = 0.2,
                     stopping: asyncio.Event | None = None,
                     on_chunk: Callable[[int, memoryview, str], None] | None = None) -> bytes:
    """One version's verified bytes from `source`, resuming from the last good chunk after
    a broken stream. Raises WeightsCorruptError on a bad checksum (nothing of it may be
    used) and grpc.aio.AioRpcError when the source stays unreachable or does not hold the
    version. Chunks are checked on a worker thread while the next ones arrive (hashing
    releases the GIL), so verification costs little wall time; `on_chunk(offset, data,
    sha256)` is called on the event loop with each chunk once verified, in order (a relay
    serving the version as it arrives)."""
    asm = WeightAssembler(notice.policy_version, notice.size_bytes, notice.sha256)
    loop = asyncio.get_running_loop()

    def verify(offset: int, data: memoryview, sha256: str) -> None:
        asm.add_chunk(offset, data, sha256)
        if on_chunk is not None:
            loop.call_soon_threadsafe(on_chunk, offset, data, sha256)

    attempt = 0
    with futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify") as verifier:
        while not asm.complete:
            checks: list[asyncio.Future] = []
            try:
                async for chunk in source.fetch(notice.policy_version, asm.next_offset):
                    checks.append(loop.run_in_executor(verifier, verify, chunk.offset_bytes, chunk.data,
                                                       chunk.sha256))
                    if checks[-1].done():
                        checks.pop().result()  # surface a bad chunk early
            except WeightsCorruptError:
                await asyncio.gather(*checks, return_exceptions=True)  # the rest fail after it: consumed
                raise
            except grpc.aio.AioRpcError as err:
                await _settle(checks)
                attempt += 1
                stopped = stopping is not None and stopping.is_set()
                if attempt >= max_attempts or err.code() == grpc.StatusCode.NOT_FOUND or stopped:
                    raise
                log.warning("weight fetch of v%d broke at byte %d (%s); resuming", notice.policy_version,
                            asm.next_offset, err.code().name)
                await asyncio.sleep(backoff_s * attempt)
            else:
                await _settle(checks)
                if not asm.complete:
                    raise WeightsCorruptError(
                        f"version {notice.policy_version}: stream ended at byte {asm.next_offset}")
    return asm.finish()


async def _settle(checks: list[asyncio.Future]) -> None:
    """Wait for the queued chunk checks; raise the first failure (the ones after it fail
    because of it, and are consumed)."""
    for result in await asyncio.gather(*checks, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


def chunk_responses(version: WeightVersion, offset_bytes: int) -> Iterator[bytes]:
    """The FetchWeights stream of a held version, encoded (see codec.encode_chunk);
    ValueError for a bad offset, raised by this call rather than mid-stream."""
    return (encode_chunk(version, offset, data, sha) for offset, data, sha in version.chunks(offset_bytes))


def rollout_handler(connect, fetch_weights, fetch_model=None) -> grpc.GenericRpcHandler:
    """The streamrl.v1.Rollout service from its behaviours, FetchWeights sending the
    pre-encoded chunks as they are. Connect reads each ConnectRequest as the bytes that came,
    so the servicer can refuse (and count) one too large or undecodable before parsing it.
    FetchModel only where given (the trainer; a relaying replica answers UNIMPLEMENTED)."""
    methods = {
        "Connect": grpc.stream_stream_rpc_method_handler(
            connect, request_deserializer=None, response_serializer=pb.ConnectResponse.SerializeToString),
        "FetchWeights": grpc.unary_stream_rpc_method_handler(
            fetch_weights, request_deserializer=pb.FetchWeightsRequest.FromString, response_serializer=None),
    }
    if fetch_model is not None:
        methods["FetchModel"] = grpc.unary_stream_rpc_method_handler(
            fetch_model, request_deserializer=pb.FetchModelRequest.FromString,
            response_serializer=pb.FetchModelResponse.SerializeToString)
    return grpc.method_handlers_generic_handler("streamrl.v1.Rollout", methods)


async def serve_version(version: WeightVersion | None, request: pb.FetchWeightsRequest,
                        context: grpc.aio.ServicerContext, where: str = "") -> AsyncIterator[bytes]:
    """A FetchWeights call's responses for the version held (None: NOT_FOUND)."""
    if version is None:
        await context.abort(grpc.StatusCode.NOT_FOUND, f"weight version {request.policy_version} is not held{where}")
    try:
        responses = chunk_responses(version, request.offset_bytes)
    except ValueError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    for response in responses:
        yield response
