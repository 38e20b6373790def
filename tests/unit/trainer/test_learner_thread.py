"""Every learner call of the trainer's loop runs on one thread, the process's compute thread
(colocated: the engine's), as `streamrl profile` measures the learner: torch and the C library
keep state per calling thread (an OpenMP team, a malloc arena and the pages it has touched),
which a learner hopping between the event loop's executor threads pays again on each hop."""

import asyncio
import threading

from streamrl.generator.torch_engine import TorchEngine
from streamrl.generator.worker import Worker
from streamrl.metrics import ServiceMetrics
from streamrl.models import load_model
from streamrl.rollout.iteration import IterationPlanner
from streamrl.rollout.work import SamplingConfig
from streamrl.spec import AlgorithmSpec, load_job
from streamrl.trainer.coordinator import Coordinator
from streamrl.trainer.learner import Learner
from streamrl.trainer.loop import TrainLoop
from streamrl.trainer.profile import synthetic_groups
from streamrl.trainer.recorder import Recorder
from streamrl.weights import WeightStore


def _planner(spec) -> IterationPlanner:
    algo = spec.algorithm
    return IterationPlanner(spec.pipeline, algo.num_iterations, algo.group_size, spec.generators.dispatch)


class _ThreadNotingLearner(Learner):
    """The real learner, noting the thread each call ran on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.threads: list[tuple[str, int]] = []

    def accumulate(self, groups, num_samples_in_step):
        self.threads.append(("accumulate", threading.get_ident()))
        return super().accumulate(groups, num_samples_in_step)

    def step(self):
        self.threads.append(("step", threading.get_ident()))
        return super().step()

    def weights(self):
        self.threads.append(("weights", threading.get_ident()))
        return super().weights()


def test_accumulate_step_and_weights_share_one_thread_off_the_event_loop(tiny_model_dir, write_job, tmp_path):
    spec = load_job(write_job({"spec": {"algorithm": {"microBatchSize": 4, "groupSize": 4}}})).spec
    algo = spec.algorithm
    learner = _ThreadNotingLearner(load_model(tiny_model_dir), algo)
    coordinator = Coordinator(SamplingConfig(algo.temperature, algo.top_p, algo.max_new_tokens, algo.seed),
                              lambda sample, answer: 0.0, ServiceMetrics("trainer"))
    loop = TrainLoop(spec, coordinator=coordinator, planner=_planner(spec), learner=learner,
                     store=WeightStore(1, 1 << 20),
                     encode=lambda text: (4,), prompts=[], recorder=Recorder(tmp_path / "run"),
                     metrics=ServiceMetrics("trainer"))
    groups = synthetic_groups(8, algo.group_size, 4, 6)

    async def iterations() -> int:
        # the default executor holds several threads, as a trainer's does once weights are
        # published and checkpoints written beside training
        await asyncio.gather(*(asyncio.to_thread(threading.Event().wait, 0.05) for _ in range(4)))
        for _ in range(4):
            await loop._learner(learner.accumulate, groups, 8)
            await asyncio.to_thread(threading.Event().wait, 0.01)
            await loop._on_learner_thread(learner.step)
            await loop.publish()
        return threading.get_ident()

    event_loop_thread = asyncio.run(iterations())
    calls = [name for name, _ in learner.threads]
    assert calls == ["accumulate", "step", "weights"] * 4
    threads = {ident for _, ident in learner.threads}
    assert len(threads) == 1 and event_loop_thread not in threads
    assert learner.policy_version == 4  # the steps ran, each on that thread


def test_colocated_the_learner_runs_on_the_engine_thread_between_its_steps(tiny_model_dir, write_job, tmp_path):
    """Colocated: the loop's compute is the in-process generator's worker, so the engine and
    the learner share one thread, one OpenMP team (streamrl.compute)."""
    spec = load_job(write_job({"spec": {"algorithm": {"microBatchSize": 4, "groupSize": 4}}})).spec
    algo = spec.algorithm
    learner = _ThreadNotingLearner(load_model(tiny_model_dir), algo)
    coordinator = Coordinator(SamplingConfig(algo.temperature, algo.top_p, algo.max_new_tokens, algo.seed),
                              lambda sample, answer: 0.0, ServiceMetrics("trainer"))
    worker = Worker(TorchEngine(load_model(tiny_model_dir), max_batch_size=4, eos_token_id=-1), "local-0",
                    ServiceMetrics("generator"), on_sample=lambda s: None)
    engine_thread = threading.Thread(target=worker.run, name="engine", daemon=True)
    engine_thread.start()
    loop = TrainLoop(spec, coordinator=coordinator, planner=_planner(spec), learner=learner,
                     store=WeightStore(1, 1 << 20),
                     encode=lambda text: (4,), prompts=[], recorder=Recorder(tmp_path / "run"),
                     metrics=ServiceMetrics("trainer"), compute=worker)
    groups = synthetic_groups(8, algo.group_size, 4, 6)

    async def iterations() -> None:
        for _ in range(2):
            await loop._learner(learner.accumulate, groups, 8)
            await loop._on_learner_thread(learner.step)
            await loop.publish()

    try:
        asyncio.run(iterations())
    finally:
        worker.stop()
        engine_thread.join(10)
    assert [name for name, _ in learner.threads] == ["accumulate", "step", "weights"] * 2
    assert {ident for _, ident in learner.threads} == {engine_thread.ident}
    assert learner.policy_version == 2


def test_the_profile_measures_the_engine_and_the_learner_on_the_thread_it_is_given(tiny_model_dir):
    """`streamrl profile` measures both stages on one compute thread, as a process of the
    product runs them."""
    from concurrent.futures import ThreadPoolExecutor

    import streamrl.trainer.profile as trainer_profile
    from streamrl.generator.profile import measure_generation
    from streamrl.trainer.profile import measure_training

    spec = AlgorithmSpec(micro_batch_size=2, group_size=2, max_new_tokens=8)
    seen: dict[str, set[str]] = {"engine": set(), "learner": set()}

    class _NotingLearner(Learner):
        def accumulate(self, groups, num_samples_in_step):
            seen["learner"].add(threading.current_thread().name)
            return super().accumulate(groups, num_samples_in_step)

    class _NotingEngine(TorchEngine):
        def step(self):
            seen["engine"].add(threading.current_thread().name)
            return super().step()

    real, trainer_profile.Learner = trainer_profile.Learner, _NotingLearner
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="given") as given:
            name = given.submit(lambda: threading.current_thread().name).result()
            engine = _NotingEngine(load_model(tiny_model_dir), max_batch_size=4, eos_token_id=-1)
            g = measure_generation(engine, [1, 4], steps=2, prompt_tokens=4, prefill_batches=(1,), prefill_rounds=1,
                                   rounds=1, thread=given)
            m = measure_training(load_model(tiny_model_dir), spec, prompt_tokens=4, completion_tokens=4, steps=1,
                                 thread=given)
    finally:
        trainer_profile.Learner = real
    assert seen == {"engine": {name}, "learner": {name}}
    assert m.forward_backward_s_per_token > 0 and m.micro_batch_size == 2
    assert [b for b, _ in g.ptl] == [1, 4] and all(s > 0 for _, s in g.ptl)
