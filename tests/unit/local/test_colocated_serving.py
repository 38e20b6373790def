"""What `streamrl profile` measures of colocated serving: an iteration's work served through
the real composition (the worker on the thread it is given, the coordinator on its event
loop), every sample taken in, and the seconds beside the engine's steps per sample."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from streamrl.generator.torch_engine import TorchEngine
from streamrl.local.colocated import measure_serving
from streamrl.models import load_model
from streamrl.spec import AlgorithmSpec
from streamrl.trainer.profile import coordinator_for


class _NotingEngine(TorchEngine):
    """The real engine, noting the thread and the seconds of each step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.threads: set[str] = set()
        self.step_s = 0.0

    def step(self):
        t0 = time.perf_counter()
        self.threads.add(threading.current_thread().name)
        try:
            return super().step()
        finally:
            self.step_s += time.perf_counter() - t0


def test_serving_is_measured_on_the_given_thread_beside_the_engines_steps(tiny_model_dir):
    algo = AlgorithmSpec(group_size=4, max_new_tokens=12, micro_batch_size=4)
    engine = _NotingEngine(load_model(tiny_model_dir), max_batch_size=8, eos_token_id=2)
    coordinator = coordinator_for(lambda sample, answer: float(len(sample.completion_token_ids) % 2), algo,
                                  vocab_size=engine.model.config.vocab_size, queue_factor=1.25)
    prompts = [((1, 5 + k, 6, 7), str(k)) for k in range(6)]
    with ThreadPoolExecutor(1, thread_name_prefix="given") as given:
        name = given.submit(lambda: threading.current_thread().name).result()
        t0 = time.perf_counter()
        per_sample = measure_serving(engine, coordinator, prompts, algo.group_size, given, rounds=2)
        wall = time.perf_counter() - t0
        assert given.submit(lambda: "free again").result(5) == "free again"  # the worker left the thread
    assert engine.threads == {name}
    samples = 3 * len(prompts) * algo.group_size  # a warm-up round and two measured ones
    assert coordinator.counters.num_samples_accepted == samples
    # positive, and less than the whole wall time less every step, per measured sample
    assert 0 < per_sample < (wall - engine.step_s) / (2 * len(prompts) * algo.group_size)
