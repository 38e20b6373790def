"""gRPC edge of the trainer: converts streamrl.v1 messages (streamrl.wire.convert), calls the
coordinator and the weight store, maps errors to status codes. No domain logic here."""

from __future__ import annotations

import asyncio
import logging

import grpc

from streamrl.messages import Hello, Welcome
from streamrl.trainer.coordinator import Coordinator
from streamrl.trainer.replica import Replica
from streamrl.weights import WeightStore
from streamrl.wire.convert import request_from_pb, response_to_pb
from streamrl.wire.transfer import rollout_handler, serve_version

log = logging.getLogger(__name__)


class RolloutServicer:
    def __init__(self, coordinator: Coordinator, store: WeightStore, run_id: str):
        self.coordinator = coordinator
        self.store = store
        self.run_id = run_id

    def handler(self) -> grpc.GenericRpcHandler:
        return rollout_handler(self.Connect, self.FetchWeights)

    async def Connect(self, request_iterator, context):
        try:
            first = request_from_pb(await anext(request_iterator), "")
        except StopAsyncIteration:
            return
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        if not isinstance(first, Hello):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message of Connect must be a Hello")
        try:
            replica = self.coordinator.connect(first)
        except KeyError as err:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(err.args[0]))
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        latest = self.store.latest
        yield response_to_pb(Welcome(self.run_id, latest.policy_version if latest else 0,
                                     self.coordinator.queue.sampling.incarnation))
        reader = asyncio.create_task(self._read(replica, request_iterator), name=f"read-{replica.generator_id}")
        try:
            while (msg := await replica.outbox.get()) is not None:
                yield response_to_pb(msg)
        finally:
            read_all = reader.done()
            if not read_all:
                reader.cancel()
            self.coordinator.disconnect(replica.generator_id)
        if read_all and not reader.cancelled() and (err := reader.exception()) is not None:
            # Surfaced, never swallowed: the replica sees the error and its samples go elsewhere.
            if isinstance(err, ValueError):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            await context.abort(grpc.StatusCode.INTERNAL, f"the trainer failed on a message of "
                                                          f"{replica.generator_id}: {err!r}")

    async def _read(self, replica: Replica, request_iterator) -> None:
        """Every message after Hello to the coordinator. A message that does not convert
        ends the stream with INVALID_ARGUMENT; anything else raised ends it with INTERNAL
        (the reader's exception is read by Connect). Either way the replica's stream ends
        and what it held is re-dispatched."""
        gid = replica.generator_id
        try:
            async for req in request_iterator:
                self.coordinator.on_message(gid, request_from_pb(req, gid))
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass  # the replica went away
        except ValueError as err:
            log.warning("generator %s sent a bad message: %s", gid, err)
            raise
        except Exception:
            log.exception("stream of generator %s failed", gid)
            raise
        finally:
            replica.close()  # end its response stream

    async def FetchWeights(self, request, context):
        async for response in serve_version(self.store.get(request.policy_version), request, context):
            yield response
