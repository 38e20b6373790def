"""gRPC edge of the trainer: converts streamrl.v1 messages, calls the coordinator and the
weight store, maps errors to status codes. No domain logic here."""

from __future__ import annotations

import asyncio
import logging

import grpc

from streamrl.samples import WeightsNotice, Work
from streamrl.trainer.coordinator import BatchCap, Coordinator
from streamrl.transfer import chunk_responses
from streamrl.v1 import rollout_pb2 as pb
from streamrl.v1 import rollout_pb2_grpc
from streamrl.weights import WeightStore
from streamrl.wire import notice_to_pb, sample_from_pb, work_to_pb

log = logging.getLogger(__name__)


def _points(points) -> tuple[tuple[int, float], ...]:
    return tuple((p.batch_size, p.seconds_per_step) for p in points)


class RolloutServicer(rollout_pb2_grpc.RolloutServicer):
    def __init__(self, coordinator: Coordinator, store: WeightStore, run_id: str):
        self.coordinator = coordinator
        self.store = store
        self.run_id = run_id

    async def Connect(self, request_iterator, context):
        try:
            first = await anext(request_iterator)
        except StopAsyncIteration:
            return
        if first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message of Connect must be a Hello")
        h = first.hello
        try:
            handle = self.coordinator.connect(h.generator_id, h.pool, h.capacity, h.engine, h.policy_version,
                                              h.weights_address, _points(h.latency_profile))
        except KeyError as err:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(err.args[0]))
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        latest = self.store.latest
        yield pb.ConnectResponse(welcome=pb.Welcome(run_id=self.run_id,
                                                    policy_version=latest.policy_version if latest else 0))
        reader = asyncio.create_task(self._read(handle, request_iterator))
        try:
            while True:
                msg = await handle.outbox.get()
                if msg is None:
                    break
                if isinstance(msg, Work):
                    yield pb.ConnectResponse(assign=work_to_pb(msg))
                elif isinstance(msg, WeightsNotice):
                    yield pb.ConnectResponse(new_weights=notice_to_pb(msg))
                elif isinstance(msg, BatchCap):
                    yield pb.ConnectResponse(configure=pb.Configure(max_batch_size=msg.max_batch_size))
                else:
                    raise TypeError(f"unexpected outbox message {msg!r}")
        finally:
            reader.cancel()
            self.coordinator.disconnect(h.generator_id)

    async def _read(self, handle, request_iterator) -> None:
        gid = handle.generator_id
        try:
            async for req in request_iterator:
                kind = req.WhichOneof("kind")
                if kind == "sample":
                    self.coordinator.on_sample(gid, sample_from_pb(req.sample, gid))
                elif kind == "weights_loaded":
                    w = req.weights_loaded
                    self.coordinator.on_loaded(gid, w.policy_version, w.sync_s, w.size_bytes, w.source)
                elif kind == "draining":
                    self.coordinator.drain(gid, req.draining.reason)
                elif kind == "load":
                    handle.load = req.load
                    if req.load.latency_profile:
                        handle.latency_profile = _points(req.load.latency_profile)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            handle.outbox.put_nowait(None)  # the replica is gone: end its response stream

    async def FetchWeights(self, request, context):
        version = self.store.get(request.policy_version)
        if version is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"weight version {request.policy_version} is not held")
        try:
            responses = chunk_responses(version, request.offset_bytes)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        for resp in responses:
            yield resp
