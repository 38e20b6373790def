"""gRPC edge of the ranker: converts streamrl.v1 ranker messages (streamrl.wire.convert) and
calls the Ranker on a worker thread, one call at a time (the Ranker is not thread-safe and its
predictor is CPU work that must not hold up the event loop)."""

from __future__ import annotations

import asyncio
import math

import grpc

from streamrl.metrics import RankerMetrics
from streamrl.ranker.ranker import Ranker
from streamrl.v1 import ranker_pb2_grpc
from streamrl.wire.convert import observation_from_pb, observed_to_pb, predictions_to_pb, rank_request_from_pb


class RankerServicer(ranker_pb2_grpc.RankerServicer):
    def __init__(self, ranker: Ranker, metrics: RankerMetrics):
        self.ranker = ranker
        self.metrics = metrics
        self.lock = asyncio.Lock()
        self.recall_every = 64
        self.recall: dict[float, float] = {}
        """Recall of the true top-x% as last exported (read by /status from another thread)."""

    async def _call(self, fn, *args):
        async with self.lock:
            return await asyncio.to_thread(fn, *args)

    async def Rank(self, request, context):
        try:
            prompts = rank_request_from_pb(request)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return predictions_to_pb(await self._call(self.ranker.rank, prompts))

    async def Observe(self, request_iterator, context):
        n = 0
        async for req in request_iterator:
            try:
                obs = observation_from_pb(req)
            except ValueError as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            predicted = await self._call(self.ranker.observe, obs.prompt_key, obs.text, list(obs.lengths))
            actual = sum(obs.lengths) / len(obs.lengths)
            self.metrics.abs_log_error.observe(abs(math.log1p(predicted) - math.log1p(actual)))
            self.metrics.observations.inc()
            n += 1
            if n % self.recall_every == 0:
                await self._export_recall()
        await self._export_recall()
        return observed_to_pb(n)

    async def _export_recall(self) -> None:
        """Recall sorts the whole window: refreshed every recall_every observations, not each."""
        self.recall = await self._call(self.ranker.recall)
        for top, value in self.recall.items():
            if not math.isnan(value):
                self.metrics.recall.labels(f"{top:.2f}").set(value)
