"""Weight transfer over gRPC: serving a held version in chunks, and fetching one with
resume and verification. Used by the trainer, by generators relaying to their pool
peers, and by generators fetching."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import NamedTuple

import grpc

from streamrl.samples import WeightsNotice
from streamrl.spec import SecuritySpec
from streamrl.v1 import rollout_pb2 as pb
from streamrl.v1 import rollout_pb2_grpc
from streamrl.weights import WeightAssembler, WeightsCorruptError, WeightStore, WeightVersion

log = logging.getLogger(__name__)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode_chunk(version: WeightVersion, offset: int, data: memoryview, sha256: str) -> bytes:
    """A FetchWeightsResponse in protobuf wire format, built with a single copy of the
    chunk (constructing the message and serializing it would copy it twice more; at
    weight sizes those copies are most of the cost). Fields in number order, zeros omitted,
    as protobuf itself writes them."""
    parts = []
    for tag, value in ((0x08, version.policy_version), (0x10, offset)):
        if value:
            parts += [bytes((tag,)), _varint(value)]
    parts += [b"\x1a", _varint(len(data)), data, b"\x22", _varint(len(sha256)), sha256.encode()]
    if version.size_bytes:
        parts += [b"\x28", _varint(version.size_bytes)]
    return b"".join(parts)


class Chunk(NamedTuple):
    """A decoded FetchWeightsResponse whose data is a view into the received message."""

    policy_version: int
    offset_bytes: int
    data: memoryview
    sha256: str
    size_bytes: int


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise WeightsCorruptError("truncated FetchWeightsResponse")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def decode_chunk(buf: bytes) -> Chunk:
    """Parse FetchWeightsResponse wire bytes without copying the chunk (protobuf's parser
    plus `.data` would copy it twice); unknown fields are skipped."""
    view = memoryview(buf)
    fields: dict[int, object] = {}
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            fields[number], i = _read_varint(buf, i)
        elif wire_type == 2:
            n, i = _read_varint(buf, i)
            fields[number] = view[i : i + n]
            i += n
        elif wire_type in (1, 5):
            i += 8 if wire_type == 1 else 4
        else:
            raise WeightsCorruptError(f"malformed FetchWeightsResponse (wire type {wire_type})")
    if i != len(buf):
        raise WeightsCorruptError("truncated FetchWeightsResponse")
    return Chunk(fields.get(1, 0), fields.get(2, 0), fields.get(3, view[0:0]),
                 bytes(fields.get(4, b"")).decode("ascii", "replace"), fields.get(5, 0))


class WeightSource:
    """Client side of FetchWeights on a channel, decoding chunks without copies."""

    def __init__(self, channel: grpc.Channel):
        self._call = channel.unary_stream("/streamrl.v1.Rollout/FetchWeights",
                                          request_serializer=pb.FetchWeightsRequest.SerializeToString,
                                          response_deserializer=decode_chunk)

    def FetchWeights(self, request: pb.FetchWeightsRequest) -> Iterator[Chunk]:
        return self._call(request)


def chunk_responses(version: WeightVersion, offset_bytes: int) -> Iterator[bytes]:
    """The FetchWeights stream of a held version, encoded (see encode_chunk); ValueError
    for a bad offset, raised by this call rather than mid-stream."""
    return (encode_chunk(version, offset, data, sha) for offset, data, sha in version.chunks(offset_bytes))


def rollout_handler(servicer) -> grpc.GenericRpcHandler:
    """The streamrl.v1.Rollout service with FetchWeights sending pre-encoded chunks."""
    return grpc.method_handlers_generic_handler("streamrl.v1.Rollout", {
        "Connect": grpc.stream_stream_rpc_method_handler(
            servicer.Connect, request_deserializer=pb.ConnectRequest.FromString,
            response_serializer=pb.ConnectResponse.SerializeToString),
        "FetchWeights": grpc.unary_stream_rpc_method_handler(
            servicer.FetchWeights, request_deserializer=pb.FetchWeightsRequest.FromString,
            response_serializer=None),
    })


def fetch_blob(source, notice: WeightsNotice, max_attempts: int = 5, backoff_s: float = 0.2,
               stopping: threading.Event | None = None) -> bytes:
    """Fetch one version's verified bytes from `source` (a WeightSource, or anything whose
    FetchWeights yields chunks), resuming from the last good chunk after a broken
    stream. Raises WeightsCorruptError on a bad checksum (nothing of it may be used) and
    grpc.RpcError when the source stays unreachable or does not hold the version.

    Chunks are checked on a second thread while the next ones arrive (hashing releases
    the GIL), so verification costs little wall time."""
    asm = WeightAssembler(notice.policy_version, notice.size_bytes, notice.sha256)
    attempt = 0
    with futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify") as verifier:
        while not asm.complete:
            checks = []
            try:
                request = pb.FetchWeightsRequest(policy_version=notice.policy_version, offset_bytes=asm.next_offset)
                for chunk in source.FetchWeights(request):
                    checks.append(verifier.submit(asm.add_chunk, chunk.offset_bytes, chunk.data, chunk.sha256))
                    if checks[-1].done():
                        checks.pop().result()  # surface a bad chunk early
            except grpc.RpcError as err:
                _settle(checks)
                attempt += 1
                stopped = stopping is not None and stopping.is_set()
                if attempt >= max_attempts or err.code() == grpc.StatusCode.NOT_FOUND or stopped:
                    raise
                log.warning("weight fetch of v%d broke at byte %d (%s); resuming", notice.policy_version,
                            asm.next_offset, err.code().name)
                time.sleep(backoff_s * attempt)
            else:
                _settle(checks)
                if not asm.complete:
                    raise WeightsCorruptError(
                        f"version {notice.policy_version}: stream ended at byte {asm.next_offset}")
    return asm.finish()


def _settle(checks: list[futures.Future]) -> None:
    """Wait for queued chunk checks; re-raise the first failure."""
    for check in checks:
        check.result()


class RelayServer(rollout_pb2_grpc.RolloutServicer):
    """A generator's FetchWeights server for the versions it holds (in-pool relay)."""

    def __init__(self, keep: int, chunk_bytes: int, host: str = "127.0.0.1", port: int = 0,
                 security: SecuritySpec | None = None):
        from streamrl.security import add_port, server_interceptors
        from streamrl.wire import GRPC_OPTIONS

        security = security or SecuritySpec()
        self.store = WeightStore(keep, chunk_bytes)
        self.bytes_served = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=GRPC_OPTIONS,
                                   interceptors=server_interceptors(security, aio=False))
        self._server.add_generic_rpc_handlers((rollout_handler(self),))
        self.port = add_port(self._server, f"{host}:{port}", security)
        self.address = f"{host}:{self.port}"

    def hold(self, policy_version: int, blob: bytes) -> None:
        self.store.add(WeightVersion.build(policy_version, blob, self.store.chunk_bytes))

    def FetchWeights(self, request, context):
        version = self.store.get(request.policy_version)
        if version is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"weight version {request.policy_version} is not held here")
        try:
            responses = chunk_responses(version, request.offset_bytes)
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        for resp in responses:
            self.bytes_served += len(resp)
            yield resp

    def Connect(self, request_iterator, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "a generator relays weights only; dial the trainer")

    def start(self) -> RelayServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=1)
