"""The trainer's main loop, one iteration at a time: dispatch prompts -> take finished
groups (all at once, or micro-batch by micro-batch while generation runs) -> optimizer
step -> publish weights -> every checkpoint.everyIterations, a checkpoint (written while
the next iterations run). The same loop drives every pipeline mode. A loop can start from a
checkpoint's state (restore) and be asked to stop at its next safe point (never inside the
learner, whose ranks must finish a command together)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import asdict
from pathlib import Path

from streamrl import compute as compute_thread
from streamrl.messages import WeightsNotice
from streamrl.metrics import WAITING_GENERATORS, WAITING_SAMPLES, ServiceMetrics
from streamrl.records import IterationRecord, StepStats, TrainerPhase
from streamrl.rollout.iteration import IterationFigures, IterationPlanner, IterationTally
from streamrl.rollout.work import PromptWork
from streamrl.samples import Group
from streamrl.spec import RLJobSpec
from streamrl.tasks import Prompt, PromptCursor
from streamrl.trainer.checkpoint import TrainerState
from streamrl.trainer.checkpointer import Checkpointer
from streamrl.trainer.coordinator import Coordinator
from streamrl.trainer.learner import Learner
from streamrl.trainer.lengths import LengthSource
from streamrl.trainer.recorder import Recorder
from streamrl.weights import WeightStore

log = logging.getLogger(__name__)


class TrainLoop:
    def __init__(self, spec: RLJobSpec, *, coordinator: Coordinator, planner: IterationPlanner, learner: Learner,
                 store: WeightStore, encode: Callable[[str], tuple[int, ...]], prompts: list[Prompt],
                 recorder: Recorder, metrics: ServiceMetrics, save_model: Callable[[Path], None] | None = None,
                 lengths: LengthSource | None = None, compute: Executor | None = None,
                 before_training: Callable[[], object] | None = None, checkpointer: Checkpointer | None = None):
        self.spec = spec
        self.coordinator = coordinator
        self.learner = learner
        self.store = store
        self.encode = encode
        self.cursor = PromptCursor(prompts, spec.task.seed, spec.task.curriculum)
        self.recorder = recorder
        self.metrics = metrics
        self.save_model = save_model
        self.lengths = lengths
        self._texts: dict[str, str] = {}  # prompt_id -> text, until consumed (ranker observations)
        self._predicted: dict[str, PromptWork] = {}  # prompts dispatched with a prediction, until consumed
        self._length_pairs: list[tuple[float, float, bool]] = []  # this iteration: (predicted, actual, long)
        self.planner = planner
        """Which iterations go out when, their predictions and the long-tail demand (the rollout
        core's; the coordinator plans the long tail for its demand)."""
        self.iteration = 0
        self.first_iteration = 0
        """Where this start began: 0, or the iteration a checkpoint resumed at."""
        self._phase = TrainerPhase.STARTING
        self.phase = TrainerPhase.STARTING
        self.last: IterationRecord | None = None
        self.ledger: list[list[str]] = []
        """The prompt ids trained in each iteration, iteration by iteration."""
        self.checkpointer = checkpointer
        """Writes a checkpoint every checkpoint.everyIterations and at the end (None: never)."""
        self.incarnation = checkpointer.incarnation if checkpointer else 0
        self.stopping: TrainerPhase | None = None
        """Set by stop_soon: the phase to end in at the next safe point."""
        self.compute = compute or compute_thread.executor("learner")
        """The one thread every learner call runs on: the process's compute thread (streamrl.compute;
        colocated, the in-process generator's engine thread), as `streamrl profile` measures it.
        torch and the C library keep state per calling thread (an OpenMP team, a malloc arena),
        which the event loop's default executor, its threads taking turns, set up again and again."""
        self.before_training = before_training
        """Colocated: run on the learner's thread before an iteration's first micro-batch (the
        in-process engine lends its KV cache back: LocalGenerator.to_training)."""
        self._busy = 0
        self._task: asyncio.Task | None = None

    def restore(self, state: TrainerState) -> None:
        """Continue a run from a checkpoint's state (the learner loaded its part): the prompts
        of every iteration from state.iteration on are drawn and issued again, under the same
        ids (the cursor is replayed: it is seeded)."""
        algo = self.spec.algorithm
        for _ in range(state.iteration):
            self.cursor.take(algo.prompts_per_step)
        self.first_iteration = self.iteration = state.iteration
        self.planner.resume_at(state.iteration)
        self.ledger = [list(ids) for ids in state.ledger[: state.iteration]]
        self.last = self.recorder.records[-1] if self.recorder.records else None
        self.coordinator.counters.restore(state.counters, sum(r.num_samples for r in self.recorder.records))

    def stop_soon(self, phase: TrainerPhase) -> None:
        """End the run in `phase` at the next safe point: now if waiting for samples or
        generators, else once the uninterrupted section in progress is done."""
        self.stopping = phase
        if self._task is not None and not self._busy:
            self._task.cancel()

    @contextlib.asynccontextmanager
    async def _uninterrupted(self):
        """A section a stop must not cut: a learner command (every rank runs it to its end),
        or an iteration's close (step, ledger, publish, record: all or none). A stop asked
        meanwhile is taken right after."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
        if self.stopping is not None and not self._busy:
            raise asyncio.CancelledError(f"stopping: {self.stopping.value}")

    async def _learner(self, fn, *args):
        async with self._uninterrupted():
            return await self._on_learner_thread(fn, *args)

    async def _on_learner_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.compute, functools.partial(fn, *args))

    @property
    def phase(self) -> TrainerPhase:
        return self._phase

    @phase.setter
    def phase(self, value: TrainerPhase) -> None:
        self._phase = value
        self.metrics.set_phase(value)

    async def dispatch_due(self, training: int) -> None:
        """Hand out the prompts of every iteration due before `training` trains (the planner's
        rule: up to `staleness` iterations ahead), with predicted lengths when there are any."""
        algo = self.spec.algorithm
        for j in self.planner.due(training):
            batch = [(f"{j}-{k}-{p.index}", p) for k, p in enumerate(self.cursor.take(algo.prompts_per_step))]
            self._texts.update((pid, p.text) for pid, p in batch)
            prompts = [PromptWork(pid, p.index, p.answer, self.encode(p.text)) for pid, p in batch]
            if self.lengths:
                prompts = await self._predict(prompts)
            self.coordinator.add_prompts(j, prompts, algo.group_size, self.planner.min_policy_version(j))

    async def _predict(self, prompts: list[PromptWork]) -> list[PromptWork]:
        """The prompts with predicted lengths and the long-tail split (the demand the
        coordinator plans the long tail for as they go out)."""
        assert self.lengths is not None  # asked only with a length source
        lengths = await self.lengths.predict([(p.prompt_id, p.dataset_index, self._texts[p.prompt_id])
                                              for p in prompts])
        predicted = self.planner.predict(prompts, lengths)
        self._predicted.update((p.prompt_id, p) for p in predicted)
        return predicted

    async def publish(self) -> WeightsNotice:
        t0 = time.monotonic()
        weights = await self._learner(self.learner.weights)
        version = await asyncio.to_thread(self.store.publish, self.learner.policy_version, weights)
        notice = WeightsNotice(version.policy_version, version.size_bytes, version.num_chunks, version.sha256)
        self.coordinator.announce(notice)
        self.metrics.policy_version.set(version.policy_version)
        self.metrics.weight_publish_seconds.observe(time.monotonic() - t0)
        return notice

    async def run(self) -> None:
        self._task = asyncio.current_task()
        algo = self.spec.algorithm
        self.metrics.clock.busy()
        await self.publish()
        self.metrics.max_staleness.set(self.spec.pipeline.staleness)
        self.phase = TrainerPhase.WAITING_FOR_GENERATORS
        self.metrics.clock.idle(WAITING_GENERATORS)
        await self.coordinator.wait_for_generators(self.spec.trainer.min_generators)
        self.phase = TrainerPhase.RUNNING
        for it in range(self.first_iteration, algo.num_iterations):
            self.iteration = it
            await self.finish_checkpoint(wait=False)
            await self.run_iteration(it)
        await self.checkpoint()  # the end is resumable too: a longer numIterations continues from it
        await self.finish_checkpoint(wait=True)
        self.phase = TrainerPhase.SUCCEEDED

    # ---- checkpoints ------------------------------------------------------------------
    async def checkpoint(self) -> None:
        """Start a checkpoint of the iterations trained so far (written while training goes on)."""
        if self.checkpointer is not None:
            await self.checkpointer.save(self.ledger, self.coordinator.counters.totals(), self._learner)

    async def finish_checkpoint(self, wait: bool) -> None:
        """Complete the checkpoint being written once it is on disk (now, with `wait`)."""
        if self.checkpointer is not None:
            await self.checkpointer.finish(wait)

    async def checkpoint_on_the_way_out(self) -> None:
        """A stopped run checkpoints what it trained; a save being written completes (the
        Checkpointer's on_the_way_out). The stop is taken: the sections it runs must end."""
        stopped = self.stopping is not None or self.phase in (TrainerPhase.INTERRUPTED, TrainerPhase.PREEMPTED)
        self.stopping = None
        if self.checkpointer is not None:
            await self.checkpointer.on_the_way_out(self.phase, stopped, self.ledger,
                                                   self.coordinator.counters.totals(), self._learner)

    async def run_iteration(self, it: int) -> None:
        algo = self.spec.algorithm
        clock = self.metrics.clock
        tally = IterationTally.start(self.spec.pipeline, algo.prompts_per_step, algo.group_size,
                                     algo.micro_batch_size, time.monotonic(), clock.seconds("idle", WAITING_SAMPLES),
                                     self.coordinator.skewness_bubble_seconds())
        await self.dispatch_due(it)
        min_version = self.learner.policy_version - self.spec.pipeline.staleness
        groups: list[Group] = []
        while (want := tally.want()) is not None:
            clock.idle(WAITING_SAMPLES)
            got = await self.coordinator.take_groups(it, *want, min_version)
            for g in got:
                self._observe(g)
            groups.extend(got)
            tally.took(sum(g.num_samples for g in got), time.monotonic())
            clock.busy()
            if self.before_training is not None and len(groups) == len(got):  # the iteration's first take
                await self._on_learner_thread(self.before_training)
            await self._learner(self.learner.accumulate, got, tally.total)
        async with self._uninterrupted():  # the iteration closes whole, or not at all
            stats = await self._on_learner_thread(self.learner.step)
            self.ledger.append(sorted(g.prompt_id for g in groups))
            self.recorder.trained(it, self.ledger[-1], self.incarnation)
            self.metrics.train_step_seconds.observe(stats.train_s)
            await self.publish()
            clock.idle(WAITING_SAMPLES)
            samples = [s.sample for g in groups for s in g.samples]
            # The learner's version before this step is what consumed the samples.
            figures = tally.close(time.monotonic(), clock.seconds("idle", WAITING_SAMPLES),
                                  self.coordinator.skewness_bubble_seconds(), len(self.coordinator.replicas),
                                  [len(s.completion_token_ids) for s in samples],
                                  [self.learner.policy_version - 1 - s.policy_version for s in samples])
            self._record(it, groups, stats, figures)
            every = self.spec.checkpoint.every_iterations
            if every and (it + 1) % every == 0:
                await self.checkpoint()

    def _observe(self, group: Group) -> None:
        """Staleness, recent lengths, the ranker's feedback and the run's length record."""
        lengths = [len(s.sample.completion_token_ids) for s in group.samples]
        for n in lengths:
            self.metrics.output_length.observe(n)
        for s in group.samples:
            self.metrics.sample_staleness.observe(self.learner.policy_version - s.sample.policy_version)
        self.planner.observe(lengths)
        text = self._texts.pop(group.prompt_id, "")
        predicted = self._predicted.pop(group.prompt_id, None)
        if predicted is not None:
            self._length_pairs.append((predicted.predicted_length, sum(lengths) / len(lengths), predicted.long_tail))
        if self.lengths:
            self.lengths.observe(group.dataset_index, text, self.learner.policy_version, lengths)
        self.recorder.lengths(group.prompt_id, group.dataset_index, lengths,
                              predicted.predicted_length if predicted is not None else None)

    def _length_prediction_record(self) -> dict:
        """Predicted vs actual mean output length of this iteration's prompts (dispatch with predictions)."""
        pairs, self._length_pairs = self._length_pairs, []
        if not pairs:
            return {}
        longs = [a for _, a, is_long in pairs if is_long]
        regular = [a for _, a, is_long in pairs if not is_long]
        return {
            "predicted_length_mean": sum(p for p, _, _ in pairs) / len(pairs),
            "actual_length_mean": sum(a for _, a, _ in pairs) / len(pairs),
            "long_tail_actual_length_mean": sum(longs) / len(longs) if longs else 0.0,
            "regular_actual_length_mean": sum(regular) / len(regular) if regular else 0.0,
        }

    def _record(self, it: int, groups: list[Group], stats: StepStats, figures: IterationFigures) -> None:
        rewards = [s.reward for g in groups for s in g.samples]
        sync = self.coordinator.version_sync(it)
        record = IterationRecord(
            iteration=it,
            policy_version=self.learner.policy_version,
            reward_mean=sum(rewards) / len(rewards),
            **asdict(figures),
            train_s=stats.train_s,
            loss=stats.loss,
            clip_fraction=stats.clip_fraction,
            kl=stats.kl,
            grad_norm=stats.grad_norm,
            value_loss=stats.value_loss,
            mismatch_abs_logp=stats.mismatch_abs_logp,
            mismatch_kl=stats.mismatch_kl,
            mismatch_ratio_max=stats.mismatch_ratio_max,
            importance_capped_fraction=stats.importance_capped_fraction,
            num_micro_batches=stats.num_micro_batches,
            num_samples_mixed_versions=sum(s.sample.num_versions > 1 for g in groups for s in g.samples),
            versions_per_sample_mean=sum(s.sample.num_versions for g in groups for s in g.samples) / len(rewards),
            num_samples_stale_dropped=self.coordinator.counters.num_samples_stale_dropped,
            **self._length_prediction_record(),
            # How the version this iteration started from (= it) reached the generators.
            weight_sync_s_max=sync.sync_s_max,
            weight_bytes_from_trainer=sync.bytes_from_trainer,
            weight_bytes_from_peers=sync.bytes_from_peers,
            elapsed_s=time.monotonic() - self.recorder.started,
            time_unix=time.time(),
        )
        self.last = record
        self.recorder.iteration(record)
        m = self.metrics
        m.iteration.set(it + 1)
        m.reward_mean.set(record.reward_mean)
        m.pipeline_bubble_ratio.set(record.pipeline_bubble_ratio)
        m.skewness_bubble_ratio.set(record.skewness_bubble_ratio)
        m.iteration_generation_seconds.set(record.generation_s)
        m.iteration_train_seconds.set(record.train_s)
        m.iteration_wall_seconds.set(record.wall_s)
        m.sample_staleness_max.set(record.staleness_max)
        m.actual_length_mean.set(record.completion_tokens_mean)
        m.mismatch_abs_logp.set(record.mismatch_abs_logp)
        m.mismatch_kl.set(record.mismatch_kl)
        m.mismatch_ratio_max.set(record.mismatch_ratio_max)
        m.importance_capped_fraction.set(record.importance_capped_fraction)
        if record.predicted_length_mean is not None:
            m.predicted_length_mean.set(record.predicted_length_mean)
        log.info("iteration %d: reward %.3f, %.1f samples/s, bubble %.2f", it, record.reward_mean,
                 record.samples_per_s, record.pipeline_bubble_ratio)
