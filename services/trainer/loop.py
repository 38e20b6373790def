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
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path

from streamrl import compute as compute_thread
from streamrl.messages import WeightsNotice
from streamrl.metrics import WAITING_GENERATORS, WAITING_SAMPLES, ServiceMetrics
from streamrl.records import CheckpointInfo, IterationRecord, RunEvent, StepStats, TrainerPhase, append_event
from streamrl.samples import Group
from streamrl.spec import RLJobSpec
from streamrl.tasks import Prompt, PromptCursor
from streamrl.trainer.checkpoint import Checkpoints, JobIdentity, TrainerState
from streamrl.trainer.coordinator import Coordinator
from streamrl.trainer.groups import PromptWork
from streamrl.trainer.learner import Learner
from streamrl.trainer.lengths import LengthSource
from streamrl.trainer.longtail import (
    LatencyProfile,
    LongTailDemand,
    ReplicaProfile,
    length_targets,
    plan_long_tail,
    split_long_tail,
)
from streamrl.trainer.recorder import Recorder
from streamrl.weights import WeightStore

log = logging.getLogger(__name__)


class TrainLoop:
    def __init__(self, spec: RLJobSpec, coordinator: Coordinator, learner: Learner, store: WeightStore,
                 encode, prompts: list[Prompt], recorder: Recorder, metrics: ServiceMetrics,
                 save_model: Callable[[Path], None] | None = None, lengths: LengthSource | None = None,
                 compute: Executor | None = None):
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
        self._recent_lengths: deque[int] = deque(maxlen=4096)  # D: recent output lengths
        self._demand: LongTailDemand | None = None
        """The latest iteration's long-tail demand (re-planned when replicas join or leave)."""
        coordinator.on_membership_change = self._replan
        self.iteration = 0
        self.first_iteration = 0
        """Where this start began: 0, or the iteration a checkpoint resumed at."""
        self._dispatched = -1
        self._phase = TrainerPhase.STARTING
        self.phase = TrainerPhase.STARTING
        self.last: IterationRecord | None = None
        self.ledger: list[list[str]] = []
        """The prompt ids trained in each iteration, iteration by iteration."""
        self.checkpoints: Checkpoints | None = None
        self.identity: JobIdentity | None = None
        self.run_id, self.incarnation = "", 0
        self._saving: tuple[object, Path, TrainerState] | None = None
        """(rank 0's save future, its staging directory, the state it records) being written."""
        self.stopping: TrainerPhase | None = None
        """Set by stop_soon: the phase to end in at the next safe point."""
        self.compute = compute or compute_thread.executor("learner")
        """The one thread every learner call runs on: the process's compute thread (streamrl.compute;
        colocated, the in-process generator's engine thread), as `streamrl profile` measures it.
        torch and the C library keep state per calling thread (an OpenMP team, a malloc arena),
        which the event loop's default executor, its threads taking turns, set up again and again."""
        self._busy = 0
        self._task: asyncio.Task | None = None
        self.checkpoint_wait_s = 0.0
        """Seconds training waited on checkpoints in this start."""

    def enable_checkpoints(self, checkpoints: Checkpoints, identity: JobIdentity, run_id: str,
                           incarnation: int) -> None:
        self.checkpoints, self.identity, self.run_id, self.incarnation = checkpoints, identity, run_id, incarnation

    def restore(self, state: TrainerState) -> None:
        """Continue a run from a checkpoint's state (the learner loaded its part): the prompts
        of every iteration from state.iteration on are drawn and issued again, under the same
        ids (the cursor is replayed: it is seeded)."""
        algo = self.spec.algorithm
        for _ in range(state.iteration):
            self.cursor.take(algo.prompts_per_step)
        self.first_iteration = self.iteration = state.iteration
        self._dispatched = state.iteration - 1
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

    async def dispatch_through(self, last_iteration: int) -> None:
        """Hand out the prompts of every iteration up to last_iteration not yet handed out.
        Iteration j may be generated by weights no older than j - staleness, so that it is
        at most `staleness` versions old when iteration j trains on it (at version j)."""
        algo = self.spec.algorithm
        last_iteration = min(last_iteration, algo.num_iterations - 1)
        while self._dispatched < last_iteration:
            j = self._dispatched = self._dispatched + 1
            batch = [(f"{j}-{k}-{p.index}", p) for k, p in enumerate(self.cursor.take(algo.prompts_per_step))]
            self._texts.update((pid, p.text) for pid, p in batch)
            prompts = [PromptWork(pid, p.index, p.answer, self.encode(p.text)) for pid, p in batch]
            if self.lengths:
                prompts = await self._predict(prompts)
            self.coordinator.add_prompts(j, prompts, algo.group_size, max(0, j - self.spec.pipeline.staleness))

    async def _predict(self, prompts: list[PromptWork]) -> list[PromptWork]:
        """The prompts with predicted lengths and the long-tail split, and a fresh replica plan."""
        dispatch = self.spec.generators.dispatch
        lengths = await self.lengths.predict([(p.prompt_id, p.dataset_index, self._texts[p.prompt_id])
                                              for p in prompts])
        long_ids, regular_ids = split_long_tail(lengths, dispatch.long_tail_fraction)
        recent = list(self._recent_lengths) or [round(v) for v in lengths.values()]
        l_long, l_reg = length_targets(recent)
        g = self.spec.algorithm.group_size
        self._demand = LongTailDemand(len(long_ids) * g, len(regular_ids) * g, l_long, l_reg)
        self._replan()
        long_set = set(long_ids)
        predicted = [replace(p, predicted_length=lengths[p.prompt_id], long_tail=p.prompt_id in long_set)
                     for p in prompts]
        self._predicted.update((p.prompt_id, p) for p in predicted)
        return predicted

    def _replan(self) -> None:
        """Choose the long-tail replicas for the current demand (also when replicas join or leave)."""
        if self._demand is None or not self.coordinator.replicas:
            return
        dispatch = self.spec.generators.dispatch
        replicas = [ReplicaProfile(r.generator_id, LatencyProfile(r.latency_profile or ((1, 1.0),)), r.capacity)
                    for r in self.coordinator.replicas.values() if not r.draining]
        if not replicas:
            return
        plan = plan_long_tail(self._demand, replicas, dispatch.long_tail_batch_cap, dispatch.objective)
        self.coordinator.set_long_tail_replicas(set(plan.long_replicas), dispatch.long_tail_batch_cap)
        d = self._demand
        log.info("long-tail plan: %d of %d replicas on the long tail (estimated %.2fs; for 0..%d: %s; demand %d x %.0f "
                 "+ %d x %.0f tokens; PTL ms at batch %d/full: %s)", len(plan.long_replicas), len(replicas),
                 plan.estimated_s, len(replicas), " ".join(f"{t:.2f}" for t in plan.estimates_s), d.num_long_samples,
                 d.long_length, d.num_regular_samples, d.regular_length, dispatch.long_tail_batch_cap,
                 " ".join(f"{r.replica_id}={r.profile.ptl(dispatch.long_tail_batch_cap) * 1e3:.2f}/"
                          f"{r.profile.ptl(r.max_batch_size) * 1e3:.2f}" for r in replicas))

    async def publish(self) -> WeightsNotice:
        t0 = time.monotonic()
        weights = await self._learner(self.learner.weights)
        version = await asyncio.to_thread(self.store.publish, self.learner.policy_version, weights)
        notice = WeightsNotice(version.policy_version, version.size_bytes, version.num_chunks, version.sha256)
        self.coordinator.announce_weights(notice)
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
        """Start a checkpoint of the iterations trained so far (a save still being written is
        completed first: that wait is the only time training waits on the disk)."""
        if self.checkpoints is None:
            return
        trained = len(self.ledger)
        newest = self._saving[2].iteration if self._saving else (self.checkpoints.last.iteration
                                                                  if self.checkpoints.last else None)
        if newest == trained:
            return  # nothing new since the last one (written, or being written)
        t0 = time.monotonic()
        await self.finish_checkpoint(wait=True)
        staging = self.checkpoints.staging(trained)
        future = await self._learner(self.learner.save, staging)
        self._waited(time.monotonic() - t0)
        state = TrainerState(identity=self.identity, run_id=self.run_id, incarnation=self.incarnation,
                             iteration=trained, policy_version=self.learner.policy_version,
                             world_size=self.learner.ranks.world_size, time_unix=time.time(), ledger=self.ledger,
                             counters=self.coordinator.counters.totals())
        self._saving = (future, staging, state)

    def _waited(self, seconds: float) -> None:
        self.checkpoint_wait_s += seconds
        self.metrics.checkpoint_wait_seconds.inc(seconds)

    async def finish_checkpoint(self, wait: bool) -> CheckpointInfo | None:
        """Complete the checkpoint being written once every rank's part is on disk (now, with
        `wait`): its manifest, the rename into place, the old ones pruned."""
        if self._saving is None:
            return None
        future, staging, state = self._saving
        if not wait and not future.done():
            return None
        t0 = time.monotonic()
        await asyncio.to_thread(future.result)
        self._waited(time.monotonic() - t0)
        self._saving = None
        info = await asyncio.to_thread(self.checkpoints.complete_save, staging, state)
        self.metrics.checkpoint_iteration.set(info.iteration)
        append_event(self.recorder.out_dir, RunEvent(time_unix=time.time(), kind="checkpoint", process="trainer",
                                                     detail=f"iteration {info.iteration}"))
        return info

    async def run_iteration(self, it: int) -> None:
        algo = self.spec.algorithm
        clock = self.metrics.clock
        t0 = time.monotonic()
        idle0 = clock.seconds("idle", WAITING_SAMPLES)
        skew0 = self.coordinator.skewness_bubble_seconds()
        staleness = self.spec.pipeline.staleness
        await self.dispatch_through(it + staleness)
        min_version = self.learner.policy_version - staleness
        total = algo.prompts_per_step * algo.group_size
        done = 0
        groups: list[Group] = []
        generation_s = 0.0
        while done < total:
            clock.idle(WAITING_SAMPLES)
            left = total - done
            if self.spec.pipeline.streaming:
                need = min(self.spec.pipeline.min_micro_batch_size, left)
                # Take up to a few micro-batches at once when that many are ready, so the
                # learner can group them by length (less padding).
                got = await self.coordinator.take_groups(it, need, 4 * algo.micro_batch_size, min_version)
            else:
                got = await self.coordinator.take_groups(it, left, left, min_version)
            for g in got:
                self._observe(g)
            done += sum(g.num_samples for g in got)
            groups.extend(got)
            if done == total:
                generation_s = time.monotonic() - t0
            clock.busy()
            await self._learner(self.learner.accumulate, got, total)
        async with self._uninterrupted():  # the iteration closes whole, or not at all
            stats = await self._on_learner_thread(self.learner.step)
            self.ledger.append(sorted(g.prompt_id for g in groups))
            self.recorder.trained(it, self.ledger[-1], self.incarnation)
            self.metrics.train_step_seconds.observe(stats.train_s)
            await self.publish()
            clock.idle(WAITING_SAMPLES)
            wall = time.monotonic() - t0
            replicas = max(1, len(self.coordinator.replicas))
            skew_ratio = min(1.0, (self.coordinator.skewness_bubble_seconds() - skew0) / (replicas * wall))
            self._record(it, groups, stats, wall, clock.seconds("idle", WAITING_SAMPLES) - idle0, generation_s,
                         skew_ratio)
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
        self._recent_lengths.extend(lengths)
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

    def _record(self, it: int, groups: list[Group], stats: StepStats, wall: float, idle: float,
                generation_s: float, skewness_bubble_ratio: float) -> None:
        samples = [s for g in groups for s in g.samples]
        rewards = [s.reward for s in samples]
        lengths = [len(s.sample.completion_token_ids) for s in samples]
        # The learner's version before this step is what consumed the samples.
        staleness = [self.learner.policy_version - 1 - s.sample.policy_version for s in samples]
        sync = self.coordinator.version_sync(it)
        record = IterationRecord(
            iteration=it,
            policy_version=self.learner.policy_version,
            reward_mean=sum(rewards) / len(rewards),
            num_samples=len(samples),
            samples_per_s=len(samples) / wall,
            pipeline_bubble_ratio=min(1.0, idle / wall),
            skewness_bubble_ratio=skewness_bubble_ratio,
            wall_s=wall,
            generation_s=generation_s,
            train_s=stats.train_s,
            completion_tokens_mean=sum(lengths) / len(lengths),
            completion_tokens_max=max(lengths),
            loss=stats.loss,
            clip_fraction=stats.clip_fraction,
            kl=stats.kl,
            grad_norm=stats.grad_norm,
            num_micro_batches=stats.num_micro_batches,
            staleness_mean=sum(staleness) / len(staleness),
            staleness_max=max(staleness),
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
        m.skewness_bubble_ratio.set(skewness_bubble_ratio)
        m.iteration_generation_seconds.set(generation_s)
        m.iteration_train_seconds.set(record.train_s)
        m.iteration_wall_seconds.set(wall)
        m.sample_staleness_max.set(record.staleness_max)
        m.actual_length_mean.set(record.completion_tokens_mean)
        if record.predicted_length_mean is not None:
            m.predicted_length_mean.set(record.predicted_length_mean)
        log.info("iteration %d: reward %.3f, %.1f samples/s, bubble %.2f", it, record.reward_mean,
                 record.samples_per_s, record.pipeline_bubble_ratio)
