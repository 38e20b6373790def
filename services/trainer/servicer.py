"""gRPC edge of the trainer: parses streamrl.v1 messages (streamrl.wire.convert), calls the
coordinator and the weight store (and serves the model's other files to replicas booting from
it), maps refusals and errors to status codes. What a sample must satisfy is decided in
streamrl/rollout/refusals.py, not here."""

from __future__ import annotations

import asyncio
import logging
from typing import NoReturn

import grpc
from google.protobuf.message import DecodeError

from streamrl.messages import Hello, Welcome
from streamrl.rollout.refusals import Refusal, Refused
from streamrl.rollout.replica import Replica
from streamrl.trainer.coordinator import Coordinator
from streamrl.v1 import rollout_pb2 as pb
from streamrl.weights import WeightStore
from streamrl.wire.convert import GeneratorMessage, request_from_pb, response_to_pb
from streamrl.wire.model_files import ModelFile, model_responses
from streamrl.wire.transfer import rollout_handler, serve_version

log = logging.getLogger(__name__)


class StreamRefused(ValueError):
    """A Connect message that ends its stream (INVALID_ARGUMENT), with the counted reason."""

    def __init__(self, refused: Refused):
        super().__init__(f"{refused.reason.value}: {refused.detail}")
        self.refused = refused


class RolloutServicer:
    """The Rollout service. How bad input on a Connect stream is met (one generator's bug must
    not take the trainer down, nor cost a healthy generator its other work):

    - a bad sample is refused and counted by its reason (intake.Refusal) while the stream goes
      on; if its sender held it, it is generated again (by whichever replica has room);
    - a load report or weights-loaded report with numbers the trainer cannot use is ignored
      and counted, and the stream goes on;
    - a message that breaks the stream's protocol ends the stream with INVALID_ARGUMENT,
      counted: a first message that is not a Hello, a bad Hello (ALREADY_EXISTS for an id
      connected already), a second Hello, an empty message, bytes that are not a
      ConnectRequest, a message larger than any valid one (SampleRules.max_request_bytes);
    - so does a replica whose last MAX_MALFORMED_IN_A_ROW samples were all malformed (broken);
    - anything else raised on a message is a trainer bug: INTERNAL, never swallowed.

    A stream that ends for any reason sends its replica's unfinished work to the others, and
    the trainer keeps serving; nothing refused reaches the learner.
    """

    def __init__(self, coordinator: Coordinator, store: WeightStore, run_id: str,
                 model_files: list[ModelFile] | None = None):
        self.coordinator = coordinator
        self.store = store
        self.run_id = run_id
        self.model_files = model_files
        """The model's files other than weights, for replicas booting from the trainer (None: not served)."""

    def handler(self) -> grpc.GenericRpcHandler:
        return rollout_handler(self.Connect, self.FetchWeights, self.FetchModel if self.model_files else None)

    def _parse(self, raw: bytes, generator_id: str) -> GeneratorMessage:
        """One Connect message as sent (bytes), in domain form; StreamRefused when it cannot be."""
        limit = self.coordinator.rules.max_request_bytes
        if len(raw) > limit:
            raise StreamRefused(Refused(Refusal.OVERSIZED, f"a message of {len(raw)} bytes, more than the {limit} "
                                                           f"bytes a sample of maxNewTokens tokens can take"))
        try:
            request = pb.ConnectRequest.FromString(raw)
        except DecodeError as err:
            raise StreamRefused(Refused(Refusal.UNDECODABLE, f"{len(raw)} bytes that are not a ConnectRequest "
                                                             f"({err})")) from None
        try:
            return request_from_pb(request, generator_id)
        except ValueError as err:
            raise StreamRefused(Refused(Refusal.EMPTY_MESSAGE, str(err))) from None

    async def _refuse(self, context: grpc.aio.ServicerContext, generator_id: str, refused: Refused,
                      code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> NoReturn:
        self.coordinator.refuse_message(generator_id, refused)
        await context.abort(code, f"{refused.reason.value}: {refused.detail}")

    async def Connect(self, request_iterator, context):
        try:
            first = self._parse(await anext(request_iterator), "")
            if not isinstance(first, Hello):
                raise StreamRefused(Refused(Refusal.NOT_HELLO, f"the first message of Connect must be a Hello, not "
                                                               f"a {type(first).__name__}"))
        except StopAsyncIteration:
            return
        except StreamRefused as err:
            await self._refuse(context, "", err.refused)
        try:
            replica = self.coordinator.connect(first)
        except KeyError as err:
            await self._refuse(context, first.generator_id, Refused(Refusal.GENERATOR_ID_TAKEN, str(err.args[0])),
                               grpc.StatusCode.ALREADY_EXISTS)
        except ValueError as err:
            await self._refuse(context, first.generator_id, Refused(Refusal.BAD_HELLO, str(err)))
        latest = self.store.latest
        yield response_to_pb(Welcome(self.run_id, latest.policy_version if latest else 0,
                                     self.coordinator.rules.incarnation))
        reader = asyncio.create_task(self._read(replica, request_iterator), name=f"read-{replica.generator_id}")
        outbox = replica.outbox
        assert isinstance(outbox, asyncio.Queue)  # as the coordinator makes it (the core's Outbox only puts)
        try:
            while (msg := await outbox.get()) is not None:
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
        """Every message after Hello to the coordinator. A message that breaks the protocol
        (StreamRefused, counted here) or a broken replica (ValueError from the coordinator)
        ends the stream with INVALID_ARGUMENT; anything else raised ends it with INTERNAL (the
        reader's exception is read by Connect). Either way the replica's stream ends and what
        it held is re-dispatched."""
        gid = replica.generator_id
        try:
            async for raw in request_iterator:
                msg = self._parse(raw, gid)
                if isinstance(msg, Hello):
                    raise StreamRefused(Refused(Refusal.HELLO_AGAIN, "a second Hello on a Connect stream"))
                self.coordinator.on_message(gid, msg)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass  # the replica went away
        except StreamRefused as err:
            self.coordinator.refuse_message(gid, err.refused)
            raise
        except ValueError as err:
            log.warning("generator %s: %s; its stream ends", gid, err)
            raise
        except Exception:
            log.exception("stream of generator %s failed", gid)
            raise
        finally:
            replica.close()  # end its response stream

    async def FetchWeights(self, request, context):
        async for response in serve_version(self.store.get(request.policy_version), request, context):
            yield response

    async def FetchModel(self, request, context):
        assert self.model_files is not None  # served only with model files (rollout_handler)
        for response in model_responses(self.model_files):
            yield response
