"""Colocated mode's composition: the trainer with a generator inside its own process (one
device alternates generating a batch and training on it), the learner's calls running on the
engine's thread, the process's one compute thread. The one module that imports both the
trainer and the generator (an import contract declares it); `streamrl trainer` comes here
when the job's pipeline mode is colocated, and `streamrl profile` measures what this
composition's serving costs per sample (measure_serving).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from concurrent.futures import Executor, Future
from pathlib import Path

from prometheus_client import CollectorRegistry

from streamrl import compute
from streamrl.generator.engine import Engine, setup_engine
from streamrl.generator.worker import LoadWeights, Worker
from streamrl.messages import BatchCap, Hello, WeightsLoaded, WeightsNotice, Work
from streamrl.metrics import ServiceMetrics
from streamrl.models import load_tokenizer
from streamrl.samples import Sample
from streamrl.spec import RLJob
from streamrl.trainer import main as trainer
from streamrl.trainer.coordinator import Coordinator
from streamrl.trainer.profile import prompt_work
from streamrl.weights import WeightStore, deserialize


class LocalGenerator:
    """The same worker and coordinator as a remote replica, the replica's queue pumped in
    memory and weights taken from the trainer's store."""

    def __init__(self, engine: Engine, coordinator: Coordinator, store: WeightStore, metrics: ServiceMetrics,
                 generator_id: str = "local-0", engine_type: str = "torch"):
        self.coordinator = coordinator
        self.store = store
        self.metrics = metrics
        self.loop = asyncio.get_running_loop()
        self.worker = Worker(engine, generator_id, metrics, on_sample=self._on_sample, on_loaded=self._on_loaded)
        self.replica = coordinator.connect(Hello(generator_id, "local", engine.stats().capacity, engine_type,
                                                 engine.policy_version))
        self.replica.skewness_bubble_s = lambda: self.worker.skewness_bubble_s
        self._thread: threading.Thread | None = None
        self._on_executor: Future | None = None
        self._pump_task: asyncio.Task | None = None

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    @property
    def compute(self) -> Worker:
        """The engine thread, the process's compute thread: the learner's calls run there
        between engine steps (one OpenMP team for both; see streamrl.compute)."""
        return self.worker

    def to_training(self) -> None:
        """Colocated's switch to training, on the engine's thread: the idle engine lets go of its
        KV cache for the learner; its next step with work allocates it again."""
        self.worker.engine.sleep()

    def start(self, thread: Executor | None = None) -> None:
        """Step the engine on a compute thread of its own, or on `thread` (one that `streamrl
        profile` measured the engine and the learner on) until stop()."""
        if thread is None:
            self._thread = compute.start_thread(self.worker.run, "engine")
        else:
            self._on_executor = thread.submit(self.worker.run)
        self._pump_task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        outbox = self.replica.outbox
        assert isinstance(outbox, asyncio.Queue)  # as the coordinator makes it (the core's Outbox only puts)
        while (msg := await outbox.get()) is not None:
            if isinstance(msg, Work | BatchCap):
                self.worker.inbox.put(msg)
            elif isinstance(msg, WeightsNotice):
                version = self.store.get(msg.policy_version)
                if version is not None:
                    self.worker.inbox.put(LoadWeights(msg.policy_version, deserialize(version.blob),
                                                      time.monotonic(), version.size_bytes, "local"))

    def _on_sample(self, sample: Sample) -> None:
        self.loop.call_soon_threadsafe(self.coordinator.on_sample, self.replica.generator_id, sample)

    def _on_loaded(self, msg: LoadWeights, sync_s: float) -> None:
        loaded = WeightsLoaded(msg.policy_version, sync_s, msg.size_bytes, msg.source)
        self.loop.call_soon_threadsafe(self.coordinator.loaded, self.replica.generator_id, loaded)

    def stop(self) -> None:
        self.worker.stop()
        if self._pump_task:
            self._pump_task.cancel()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._on_executor is not None:
            self._on_executor.result(timeout=10)
        self.metrics.clock.close()


async def serve(job: RLJob, model_dir: Path, out_dir: Path, **options) -> int:
    """`streamrl trainer` for a colocated job: the trainer with its in-process generator."""
    pool = job.spec.generators.pools[0]

    def in_process(coordinator: Coordinator, store: WeightStore) -> LocalGenerator:
        # Its own metrics: the engine's busy time must not count as the trainer's.
        metrics = ServiceMetrics("generator", timeline=out_dir / "timeline" / "generator-local-0.jsonl")
        eos = load_tokenizer(model_dir).eos_token_id  # transformers types special-token ids loosely
        engine = setup_engine(pool.engine, str(model_dir), job.spec.model.dtype, eos,  # pyright: ignore[reportArgumentType]
                              threads=pool.threads, colocated=True)
        return LocalGenerator(engine, coordinator, store, metrics, engine_type=pool.engine.type)

    return await trainer.serve(job, model_dir, out_dir, in_process=in_process, **options)


def measure_serving(engine: Engine, coordinator: Coordinator, prompts: list[tuple[tuple[int, ...], str]],
                    group_size: int, thread: Executor, rounds: int = 3) -> float:
    """Seconds per sample that colocated serving takes beyond its engine's steps: an
    iteration's work (`prompts`, token ids and answer, x group_size samples) served through the
    real composition (this LocalGenerator's worker on `thread`, the coordinator on an event
    loop), `rounds` times after a warm-up, its wall time less the seconds inside the engine's
    steps, per sample (median). That is the worker's bookkeeping, each sample's hand-over to the
    event loop, the coordinator's intake and dispatch, each new assignment's way back, and the
    Python each of them holds the engine's thread back by. Decode and admission are the
    engine's own costs, measured apart."""

    async def serve() -> float:
        local = LocalGenerator(engine, coordinator, WeightStore(1, 1 << 20),
                               ServiceMetrics("generator"), generator_id="profile-local")
        local.start(thread)
        per_sample, total = [], len(prompts) * group_size
        try:
            for it in range(rounds + 1):
                stepped, t0 = local.worker.stepping_s, time.perf_counter()
                coordinator.add_prompts(it, prompt_work(it, prompts), group_size, 0)
                await coordinator.take_groups(it, total, total)
                wall = time.perf_counter() - t0
                if it:  # the first round warms up
                    per_sample.append((wall - (local.worker.stepping_s - stepped)) / total)
        finally:
            local.stop()
        return statistics.median(per_sample)

    return asyncio.run(serve())
