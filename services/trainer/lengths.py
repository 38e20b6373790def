"""Where predicted output lengths come from: the ranker service, or a previous run's
record (the oracle). The trainer's loop asks before dispatching and reports what it saw."""

from __future__ import annotations

import asyncio
import json
import logging
from abc import ABC, abstractmethod
from pathlib import Path

import grpc

from streamrl.messages import LengthObservation
from streamrl.spec import RLJobSpec, SecuritySpec
from streamrl.v1 import ranker_pb2_grpc
from streamrl.wire.channels import open_channel
from streamrl.wire.convert import observation_to_pb, predictions_from_pb, rank_request_to_pb

log = logging.getLogger(__name__)


class LengthSource(ABC):
    @abstractmethod
    async def predict(self, prompts: list[tuple[str, int, str]]) -> dict[str, float]:
        """{prompt_id: predicted mean output length} for (prompt_id, dataset_index, text)."""

    def observe(self, dataset_index: int, text: str, policy_version: int, lengths: list[int]) -> None:  # noqa: B027
        """Output lengths the policy produced for a prompt (default: ignored)."""

    async def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release what the source holds (default: nothing)."""


class RankerLengths(LengthSource):
    """The ranker service: Rank before dispatch, a standing Observe stream of what was seen."""

    def __init__(self, address: str, security: SecuritySpec):
        self._channel = open_channel(address, security)
        self._stub = ranker_pb2_grpc.RankerStub(self._channel)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._stream = asyncio.ensure_future(self._observe_forever())

    async def predict(self, prompts):
        reply = await self._stub.Rank(rank_request_to_pb([(str(index), text) for _, index, text in prompts]),
                                      timeout=30)
        return {pid: length for (pid, _, _), length in zip(prompts, predictions_from_pb(reply))}

    def observe(self, dataset_index, text, policy_version, lengths):
        self._queue.put_nowait(LengthObservation(str(dataset_index), text, policy_version, tuple(lengths)))

    async def _requests(self):
        while (obs := await self._queue.get()) is not None:
            yield observation_to_pb(obs)

    async def _observe_forever(self) -> None:
        try:
            await self._stub.Observe(self._requests())
        except grpc.aio.AioRpcError as err:
            log.error("observations to the ranker stopped: %s %s", err.code().name, err.details())

    async def close(self) -> None:
        self._queue.put_nowait(None)
        try:
            await asyncio.wait_for(self._stream, 10)
        except (TimeoutError, asyncio.CancelledError):
            self._stream.cancel()
        await self._channel.close()


class OracleLengths(LengthSource):
    """True lengths from a previous run's lengths.jsonl, by prompt id (the same cursor and
    seeds produce the same prompt ids and, on-policy, the same samples)."""

    def __init__(self, path: str | Path):
        self._lengths: dict[str, float] = {}
        try:
            for line in Path(path).read_text().splitlines():
                rec = json.loads(line)
                self._lengths[rec["prompt_id"]] = rec["mean_length"]
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"generators.dispatch.oracleLengths {path}: unusable: {err}") from None

    async def predict(self, prompts):
        return {pid: self._lengths.get(pid, 0.0) for pid, _, _ in prompts}


def setup_lengths(spec: RLJobSpec, ranker_address: str | None) -> LengthSource | None:
    policy = spec.generators.dispatch.policy
    if policy == "oracle":
        assert spec.generators.dispatch.oracle_lengths is not None  # the spec requires it with this policy
        return OracleLengths(spec.generators.dispatch.oracle_lengths)
    if policy == "skewness-aware":
        if not ranker_address:
            raise ValueError("generators.dispatch.policy 'skewness-aware' needs a ranker (--ranker host:port)")
        return RankerLengths(ranker_address, spec.security)
    return None
