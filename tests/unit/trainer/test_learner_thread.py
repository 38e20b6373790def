"""Every learner call of the trainer's loop runs on one thread of its own, as `streamrl profile`
measures the learner: torch and the C library keep state per calling thread (an OpenMP team, a
malloc arena and the pages it has touched), which a learner hopping between the event loop's
executor threads pays again on each hop."""

import asyncio
import threading

from streamrl.metrics import ServiceMetrics
from streamrl.models import load_model
from streamrl.spec import AlgorithmSpec, load_job
from streamrl.trainer.coordinator import Coordinator
from streamrl.trainer.learner import Learner
from streamrl.trainer.loop import TrainLoop
from streamrl.trainer.profile import synthetic_groups
from streamrl.trainer.recorder import Recorder
from streamrl.trainer.workqueue import SamplingConfig
from streamrl.weights import WeightStore


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
    loop = TrainLoop(spec, coordinator, learner, WeightStore(1, 1 << 20), lambda text: [4], [],
                     Recorder(tmp_path / "run"), ServiceMetrics("trainer"))
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


def test_the_profile_measures_each_stage_on_its_thread_with_the_other_stage_thread_alive(tiny_model_dir):
    """`streamrl profile`'s layout (stage_threads): the engine's thread and the learner's both
    alive throughout, the learner's holding its OpenMP team before the engine is measured, as in
    a process of the product; the training measured on the learner's thread."""
    from streamrl.trainer.profile import measure_training, stage_threads

    spec = AlgorithmSpec(micro_batch_size=2, group_size=2, max_new_tokens=8)
    seen: dict[str, set[str]] = {"engine": set(), "learner": set()}

    class _NotingLearner(Learner):
        def accumulate(self, groups, num_samples_in_step):
            seen["learner"].add(threading.current_thread().name)
            return super().accumulate(groups, num_samples_in_step)

    import streamrl.trainer.profile as trainer_profile

    real, trainer_profile.Learner = trainer_profile.Learner, _NotingLearner
    try:
        with stage_threads() as (engine_thread, learner_thread):
            threads = [t.submit(threading.current_thread).result() for t in (engine_thread, learner_thread)]
            seen["engine"].add(threads[0].name)
            m = measure_training(load_model(tiny_model_dir), spec, prompt_tokens=4, completion_tokens=4, steps=1,
                                 thread=learner_thread)
            assert all(t.is_alive() for t in threads)  # neither stage's thread ended
    finally:
        trainer_profile.Learner = real
    assert len(seen["learner"]) == 1 and next(iter(seen["learner"])).startswith("learner")
    assert next(iter(seen["engine"])).startswith("engine")
    assert m.forward_backward_s_per_token > 0 and m.micro_batch_size == 2
    assert seen["learner"] == {threads[1].name}
    assert not any(t.is_alive() for t in threads)  # both let go after
