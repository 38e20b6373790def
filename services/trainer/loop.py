"""The trainer's main loop, one iteration at a time: dispatch prompts -> take finished
groups (all at once, or micro-batch by micro-batch while generation runs) -> optimizer
step -> publish weights. The same loop drives colocated, batch and stream-sync modes."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Callable

from streamrl.metrics import WAITING_SAMPLES, ServiceMetrics
from streamrl.samples import Group, WeightsNotice
from streamrl.spec import PipelineMode, RLJobSpec
from streamrl.tasks import Prompt, PromptCursor
from streamrl.trainer.coordinator import Coordinator
from streamrl.trainer.learner import Learner
from streamrl.trainer.recorder import Recorder
from streamrl.weights import WeightStore

log = logging.getLogger(__name__)


class TrainLoop:
    def __init__(self, spec: RLJobSpec, coordinator: Coordinator, learner: Learner, store: WeightStore,
                 encode, prompts: list[Prompt], recorder: Recorder, metrics: ServiceMetrics,
                 save_model: Callable[[Path], None] | None = None):
        self.spec = spec
        self.coordinator = coordinator
        self.learner = learner
        self.store = store
        self.encode = encode
        self.cursor = PromptCursor(prompts, spec.task.seed)
        self.recorder = recorder
        self.metrics = metrics
        self.save_model = save_model
        self.iteration = 0
        self.phase = "Starting"
        self.last: dict = {}

    @property
    def streaming(self) -> bool:
        return self.spec.pipeline.mode == PipelineMode.stream_sync

    async def publish(self) -> WeightsNotice:
        t0 = time.monotonic()
        version = await asyncio.to_thread(self.store.publish, self.learner.policy_version, self.learner.weights())
        notice = WeightsNotice(version.policy_version, version.size_bytes, version.num_chunks, version.sha256)
        self.coordinator.announce_weights(notice)
        self.metrics.policy_version.set(version.policy_version)
        self.metrics.weight_sync_seconds.observe(time.monotonic() - t0)
        return notice

    async def run(self) -> None:
        algo = self.spec.algorithm
        self.metrics.clock.busy()
        await self.publish()
        self.phase = "WaitingForGenerators"
        self.metrics.clock.idle(WAITING_SAMPLES)
        await self.coordinator.wait_for_generators(1)
        self.phase = "Running"
        for it in range(algo.num_iterations):
            self.iteration = it
            await self.run_iteration(it)
        self.phase = "Succeeded"

    async def run_iteration(self, it: int) -> None:
        algo = self.spec.algorithm
        clock = self.metrics.clock
        t0 = time.monotonic()
        idle0 = clock.seconds("idle", WAITING_SAMPLES)
        batch = self.cursor.take(algo.prompts_per_step)
        self.coordinator.add_prompts(
            it,
            [(f"{it}-{k}-{p.index}", p.index, p.answer, self.encode(p.text)) for k, p in enumerate(batch)],
            algo.group_size,
            self.learner.policy_version,
        )
        total = algo.prompts_per_step * algo.group_size
        done = 0
        groups: list[Group] = []
        generation_s = 0.0
        while done < total:
            clock.idle(WAITING_SAMPLES)
            left = total - done
            if self.streaming:
                need = min(self.spec.pipeline.min_micro_batch_size, left)
                got = await self.coordinator.take_groups(need, algo.micro_batch_size)
            else:
                got = await self.coordinator.take_groups(left, left)
            done += sum(g.num_samples for g in got)
            groups.extend(got)
            if done == total:
                generation_s = time.monotonic() - t0
            clock.busy()
            await asyncio.to_thread(self.learner.accumulate, got, total)
        stats = await asyncio.to_thread(self.learner.step)
        self.metrics.train_step_seconds.observe(stats["forward_backward_s"] + stats["optimizer_s"])
        await self.publish()
        every = self.spec.checkpoint.every_iterations
        if every and self.save_model and (it + 1) % every == 0:
            await asyncio.to_thread(self.save_model, self.recorder.out_dir / "checkpoints" / f"iter-{it + 1:05d}")
        clock.idle(WAITING_SAMPLES)
        wall = time.monotonic() - t0
        self._record(it, groups, stats, wall, clock.seconds("idle", WAITING_SAMPLES) - idle0, generation_s)

    def _record(self, it: int, groups: list[Group], stats: dict, wall: float, idle: float, generation_s: float):
        samples = [s for g in groups for s in g.samples]
        rewards = [s.reward for s in samples]
        lengths = [len(s.sample.completion_token_ids) for s in samples]
        record = {
            "iteration": it,
            "policy_version": self.learner.policy_version,
            "reward_mean": sum(rewards) / len(rewards),
            "num_samples": len(samples),
            "samples_per_s": len(samples) / wall,
            "pipeline_bubble_ratio": min(1.0, idle / wall),
            "wall_s": wall,
            "generation_s": generation_s,
            "train_s": stats["forward_backward_s"] + stats["optimizer_s"],
            "completion_tokens_mean": sum(lengths) / len(lengths),
            "completion_tokens_max": max(lengths),
            "loss": stats["loss"],
            "clip_fraction": stats["clip_fraction"],
            "kl": stats["kl"],
            "grad_norm": stats["grad_norm"],
            "num_micro_batches": stats["num_micro_batches"],
            "elapsed_s": time.monotonic() - self.recorder.started,
        }
        self.last = record
        self.recorder.iteration(record)
        self.metrics.iteration.set(it + 1)
        self.metrics.reward_mean.set(record["reward_mean"])
        self.metrics.pipeline_bubble_ratio.set(record["pipeline_bubble_ratio"])
        log.info("iteration %d: reward %.3f, %.1f samples/s, bubble %.2f", it, record["reward_mean"],
                 record["samples_per_s"], record["pipeline_bubble_ratio"])
