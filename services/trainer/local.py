"""An in-process generator for colocated mode: the same worker and coordinator as a
remote replica, with the outbox pumped in memory and weights copied from the learner."""

from __future__ import annotations

import asyncio
import threading
import time

from streamrl.generator.engine import Engine
from streamrl.generator.worker import LoadWeights, SetBatchCap, Worker
from streamrl.metrics import ServiceMetrics
from streamrl.samples import WeightsNotice, Work
from streamrl.trainer.coordinator import BatchCap, Coordinator
from streamrl.weights import WeightStore, deserialize


class LocalGenerator:
    def __init__(self, engine: Engine, coordinator: Coordinator, store: WeightStore, metrics: ServiceMetrics,
                 generator_id: str = "local-0"):
        self.coordinator = coordinator
        self.store = store
        self.loop = asyncio.get_running_loop()
        self.worker = Worker(engine, generator_id, metrics, on_sample=self._on_sample, on_loaded=self._on_loaded)
        self.handle = coordinator.connect(generator_id, "local", engine.stats().capacity, "torch",
                                          engine.policy_version)
        self.handle.skewness_bubble_s = lambda: self.worker.skewness_bubble_s
        self._thread = threading.Thread(target=self.worker.run, name="engine", daemon=True)
        self._pump_task: asyncio.Task | None = None

    def start(self) -> None:
        self._thread.start()
        self._pump_task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        while True:
            msg = await self.handle.outbox.get()
            if msg is None:
                return
            if isinstance(msg, Work):
                self.worker.inbox.put(msg)
            elif isinstance(msg, BatchCap):
                self.worker.inbox.put(SetBatchCap(msg.max_batch_size))
            elif isinstance(msg, WeightsNotice):
                version = self.store.get(msg.policy_version)
                if version is not None:
                    self.worker.inbox.put(LoadWeights(msg.policy_version, deserialize(version.blob),
                                                      time.monotonic(), version.size_bytes))

    def _on_sample(self, sample) -> None:
        self.loop.call_soon_threadsafe(self.coordinator.on_sample, self.handle.generator_id, sample)

    def _on_loaded(self, msg: LoadWeights, sync_s: float) -> None:
        self.loop.call_soon_threadsafe(self.coordinator.on_loaded, self.handle.generator_id, msg.policy_version,
                                       sync_s, msg.size_bytes, "local")

    def stop(self) -> None:
        self.worker.stop()
        if self._pump_task:
            self._pump_task.cancel()
        self._thread.join(timeout=10)
        self.worker.metrics.clock.close()
