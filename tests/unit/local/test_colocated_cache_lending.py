"""Colocated mode's switch on this machine: the trainer's loop, composed as `streamrl trainer`
composes it for a colocated job (the in-process generator's worker as its compute thread and
LocalGenerator.to_training before each iteration's first micro-batch), trains with the engine's
KV cache released, and the engine takes its cache back to generate the next iteration."""

import asyncio

from streamrl.generator.torch_engine import TorchEngine
from streamrl.local.colocated import LocalGenerator
from streamrl.metrics import ServiceMetrics
from streamrl.models import load_model, load_tokenizer
from streamrl.rollout.iteration import IterationPlanner
from streamrl.rollout.work import SamplingConfig
from streamrl.spec import load_job
from streamrl.tasks import load_prompts
from streamrl.trainer.coordinator import Coordinator
from streamrl.trainer.learner import Learner
from streamrl.trainer.loop import TrainLoop
from streamrl.trainer.recorder import Recorder
from streamrl.weights import WeightStore


def test_the_learner_trains_while_the_engine_has_lent_its_cache(tiny_model_dir, write_job, tmp_path):
    spec = load_job(write_job({"spec": {"pipeline": {"mode": "colocated"},
                                        "algorithm": {"promptsPerStep": 4, "groupSize": 2, "microBatchSize": 4,
                                                      "maxNewTokens": 8, "numIterations": 2}}})).spec
    algo = spec.algorithm
    seen: list[int] = []
    generated: set[int] = set()

    class _NotingEngine(TorchEngine):
        def step(self):
            finished = super().step()
            if finished:
                generated.add(self.decoder.cache_bytes)
            return finished

    engine = _NotingEngine(load_model(tiny_model_dir), max_batch_size=8, eos_token_id=-1)
    full = engine.decoder.cache_bytes

    class _NotingLearner(Learner):
        def accumulate(self, groups, num_samples_in_step):
            seen.append(engine.decoder.cache_bytes)
            return super().accumulate(groups, num_samples_in_step)

    tok = load_tokenizer(tiny_model_dir)
    learner = _NotingLearner(load_model(tiny_model_dir), algo)
    planner = IterationPlanner(spec.pipeline, algo.num_iterations, algo.group_size, spec.generators.dispatch)
    coordinator = Coordinator(SamplingConfig(algo.temperature, algo.top_p, algo.max_new_tokens, algo.seed),
                              lambda sample, answer: 0.0, ServiceMetrics("trainer"), dispatch=spec.generators.dispatch,
                              demand=lambda: planner.demand)
    store = WeightStore(2, 1 << 20)

    async def iterations() -> list[int]:
        local = LocalGenerator(engine, coordinator, store, ServiceMetrics("generator"))
        loop = TrainLoop(spec, coordinator=coordinator, planner=planner, learner=learner, store=store,
                         encode=lambda text: (tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"]),
                         prompts=load_prompts(spec.task), recorder=Recorder(tmp_path / "run"),
                         metrics=ServiceMetrics("trainer"), compute=local.compute, before_training=local.to_training)
        local.start()
        try:
            await loop.publish()
            for it in range(algo.num_iterations):
                await loop.run_iteration(it)
            return [r.num_samples for r in loop.recorder.records]
        finally:
            local.stop()

    assert asyncio.run(iterations()) == [8, 8]
    assert seen == [0, 0]  # both iterations trained on the lent memory
    assert generated == {full}  # every sample came from the whole cache, taken back after the first training
    assert engine.decoder.cache_bytes == 0  # lent again for the last iteration's training
