"""gRPC edge of the ranker: converts streamrl.v1 ranker messages and calls the Ranker."""

from __future__ import annotations

import math
import threading

import grpc

from streamrl.metrics import RankerMetrics
from streamrl.ranker.ranker import Ranker
from streamrl.v1 import ranker_pb2 as pb
from streamrl.v1 import ranker_pb2_grpc


class RankerServicer(ranker_pb2_grpc.RankerServicer):
    def __init__(self, ranker: Ranker, metrics: RankerMetrics):
        self.ranker = ranker
        self.metrics = metrics
        self.lock = threading.Lock()  # the ranker is not thread-safe; calls are short
        self.recall_every = 64

    @staticmethod
    def _key(prompt: pb.RankedPrompt, context) -> tuple[str, str]:
        if not prompt.prompt_key and not prompt.text:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a prompt needs a prompt_key or a text")
        return prompt.prompt_key or prompt.text, prompt.text

    def Rank(self, request, context):
        prompts = [self._key(p, context) for p in request.prompts]
        with self.lock:
            ranked = self.ranker.rank(prompts)
        return pb.RankResponse(predictions=[pb.Prediction(predicted_length=length, rank=rank)
                                            for length, rank in ranked])

    def Observe(self, request_iterator, context):
        n = 0
        for req in request_iterator:
            key, text = self._key(req.prompt, context)
            if not req.lengths:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"observation of {key!r} has no lengths")
            with self.lock:
                predicted = self.ranker.observe(key, text, list(req.lengths))
            actual = sum(req.lengths) / len(req.lengths)
            self.metrics.abs_log_error.observe(abs(math.log1p(predicted) - math.log1p(actual)))
            self.metrics.observations.inc()
            n += 1
            if n % self.recall_every == 0:
                self._export_recall()
        self._export_recall()
        return pb.ObserveResponse(num_observed=n)

    def _export_recall(self) -> None:
        """Recall sorts the whole window: refreshed every recall_every observations, not each."""
        with self.lock:
            recall = self.ranker.recall()
        for top, value in recall.items():
            if not math.isnan(value):
                self.metrics.recall.labels(f"{top:.2f}").set(value)
