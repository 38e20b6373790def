"""A trainer rank's seconds, onto its /metrics: forward/backward per micro-batch, and the
collectives that can be timed from outside FSDP2 (its forward all-gathers, through module
hooks; the optimizer step; the control group's scatters and all-reduces; the weight gather).
The backward's re-gathers and reduce-scatters run inside autograd, with no public hook around
them: they stay part of forward/backward. Knows the metric collectors, not the learning."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from streamrl.metrics import (
    ALL_REDUCE,
    FORWARD_ALL_GATHER,
    GATHER_WEIGHTS,
    OPTIMIZER_STEP,
    SCATTER,
    ServiceMetrics,
)
from streamrl.trainer.ranks import Ranks


class RankTimings:
    """Every rank has one (no metrics: it measures nothing). Series are exported from the
    start at 0, so rate() reads 0 rather than nothing; those of collectives a world of one
    rank does not run (its scatter is a local call) are not exported there."""

    def __init__(self, metrics: ServiceMetrics | None, ranks: Ranks):
        self.sharded = ranks.world_size > 1
        self._forward_backward = self._collective = None
        if metrics is None:
            return
        rank = str(ranks.rank)
        metrics.trainer_rank_info.labels(rank, str(ranks.world_size)).set(1)
        self._forward_backward = metrics.trainer_forward_backward_seconds.labels(rank)
        kinds = [OPTIMIZER_STEP, GATHER_WEIGHTS, *([FORWARD_ALL_GATHER, SCATTER, ALL_REDUCE] if self.sharded else [])]
        self._collective = {kind: metrics.trainer_collective_seconds.labels(rank, kind) for kind in kinds}

    def forward_backward(self, seconds: float) -> None:
        if self._forward_backward is not None:
            self._forward_backward.observe(seconds)

    @contextmanager
    def collective(self, kind: str) -> Iterator[None]:
        """Time the block as `kind` (nothing for a collective a one-rank world does not run)."""
        counter = self._collective.get(kind) if self._collective is not None else None
        if counter is None:
            yield
            return
        t0 = time.monotonic()
        try:
            yield
        finally:
            counter.inc(time.monotonic() - t0)

    def watch_all_gathers(self, model: torch.nn.Module | None) -> None:
        """Time FSDP2's pre-forward of every sharded unit of `model`: it all-gathers the unit's
        parameters and waits for them. FSDP2 registers it as a forward pre-hook put first, so
        a hook put before it and one after it (both public nn.Module hooks) bracket it."""
        if model is None or self._collective is None or not self.sharded:
            return
        from torch.distributed.fsdp import FSDPModule

        counter = self._collective[FORWARD_ALL_GATHER]
        for module in model.modules():
            if isinstance(module, FSDPModule):
                started: list[float] = []

                def before(_m, _a, s: list[float] = started) -> None:
                    s.append(time.monotonic())

                def after(_m, _a, s: list[float] = started) -> None:
                    counter.inc(time.monotonic() - s.pop())

                module.register_forward_pre_hook(before, prepend=True)
                module.register_forward_pre_hook(after)
