"""Weight transfer over gRPC: serving a held version in chunks, and fetching one with
resume and verification. Used by the trainer, by generators relaying to their pool
peers, and by generators fetching."""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from typing import Iterator

import grpc

from streamrl.samples import WeightsNotice
from streamrl.spec import SecuritySpec
from streamrl.v1 import rollout_pb2 as pb
from streamrl.v1 import rollout_pb2_grpc
from streamrl.weights import WeightAssembler, WeightsCorruptError, WeightStore, WeightVersion

log = logging.getLogger(__name__)


def chunk_responses(version: WeightVersion, offset_bytes: int) -> Iterator[pb.FetchWeightsResponse]:
    """The FetchWeights stream of a held version; ValueError for a bad offset (before any chunk)."""
    chunks = version.chunks(offset_bytes)
    first = next(chunks, None)  # validates the offset now, not mid-stream
    if first is None:
        return
    for offset, data, sha in (first, *chunks):
        yield pb.FetchWeightsResponse(policy_version=version.policy_version, offset_bytes=offset, data=data,
                                      sha256=sha, size_bytes=version.size_bytes)


def fetch_blob(stub, notice: WeightsNotice, max_attempts: int = 5, backoff_s: float = 0.2,
               stopping: threading.Event | None = None) -> bytes:
    """Fetch one version's verified bytes, resuming from the last good chunk after a broken
    stream. Raises WeightsCorruptError on a bad checksum (nothing of it may be used) and
    grpc.RpcError when the source stays unreachable or does not hold the version."""
    asm = WeightAssembler(notice.policy_version, notice.size_bytes, notice.sha256)
    attempt = 0
    while not asm.complete:
        try:
            request = pb.FetchWeightsRequest(policy_version=notice.policy_version, offset_bytes=asm.next_offset)
            for chunk in stub.FetchWeights(request):
                asm.add_chunk(chunk.offset_bytes, chunk.data, chunk.sha256)
        except grpc.RpcError as err:
            attempt += 1
            if attempt >= max_attempts or err.code() == grpc.StatusCode.NOT_FOUND or (stopping and stopping.is_set()):
                raise
            log.warning("weight fetch of v%d broke at byte %d (%s); resuming", notice.policy_version,
                        asm.next_offset, err.code().name)
            time.sleep(backoff_s * attempt)
        else:
            if not asm.complete:
                raise WeightsCorruptError(f"version {notice.policy_version}: stream ended at byte {asm.next_offset}")
    return asm.finish()


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
        rollout_pb2_grpc.add_RolloutServicer_to_server(self, self._server)
        self.port = add_port(self._server, f"{host}:{port}", security)
        self.address = f"{host}:{self.port}"

    def hold(self, policy_version: int, blob: bytes) -> None:
        self.store.add(WeightVersion.build(policy_version, blob, self.store.chunk_bytes))

    def FetchWeights(self, request, context):
        version = self.store.get(request.policy_version)
        if version is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"weight version {request.policy_version} is not held here")
        try:
            for resp in chunk_responses(version, request.offset_bytes):
                self.bytes_served += len(resp.data)
                yield resp
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))

    def Connect(self, request_iterator, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "a generator relays weights only; dial the trainer")

    def start(self) -> "RelayServer":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=1)
