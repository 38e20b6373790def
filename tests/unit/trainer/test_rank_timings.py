"""A rank's seconds on its /metrics at world size 1: one forward/backward observation per
micro-batch, the optimizer step and the weight gather timed, and no series for the
collectives a one-rank world does not run."""

import pytest
import torch
from prometheus_client import generate_latest

from streamrl.metrics import ServiceMetrics
from streamrl.models import load_model
from streamrl.samples import Group, Sample, ScoredSample
from streamrl.spec import AlgorithmSpec
from streamrl.trainer.learner import Learner
from streamrl.trainer.ranks import Ranks
from streamrl.trainer.timings import RankTimings


def _value(metrics: ServiceMetrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def _group(n: int) -> Group:
    samples = tuple(ScoredSample(Sample("p", i, (7, 8, 2), (-1.0, -1.0, -1.0), 0, "stop"), 0.0, 1.0 - i)
                    for i in range(n))
    return Group("p", 0, 0, (1, 5, 6), samples)


def test_a_learner_times_its_micro_batches_step_and_gather(tiny_model_dir):
    torch.manual_seed(0)
    metrics = ServiceMetrics("trainer")
    learner = Learner(load_model(tiny_model_dir), AlgorithmSpec(micro_batch_size=2), metrics=metrics)
    learner.accumulate([_group(5)], num_samples_in_step=5)  # 3 micro-batches of at most 2
    stats = learner.step()
    weights = learner.weights()
    assert weights and stats.num_micro_batches == 3
    count = _value(metrics, "streamrl_trainer_forward_backward_seconds_count", rank="0")
    total = _value(metrics, "streamrl_trainer_forward_backward_seconds_sum", rank="0")
    assert count == 3 and total == pytest.approx(stats.forward_backward_s, rel=0.05)
    step = _value(metrics, "streamrl_trainer_collective_seconds_total", rank="0", kind="optimizer_step")
    gather = _value(metrics, "streamrl_trainer_collective_seconds_total", rank="0", kind="gather_weights")
    assert 0 < step <= stats.train_s and gather > 0
    assert _value(metrics, "streamrl_trainer_rank_info", rank="0", world_size="1") == 1
    text = generate_latest(metrics.registry).decode()
    for kind in ("forward_all_gather", "scatter", "all_reduce"):  # local calls at world size 1
        assert f'kind="{kind}"' not in text


def test_without_metrics_nothing_is_measured_and_blocks_still_run():
    timings = RankTimings(None, Ranks())
    ran = []
    with timings.collective("optimizer_step"):
        ran.append(1)
    timings.forward_backward(1.0)
    timings.watch_all_gathers(torch.nn.Linear(2, 2))
    assert ran == [1]


def test_a_failing_block_is_still_counted_and_raises():
    metrics = ServiceMetrics("trainer")
    timings = RankTimings(metrics, Ranks())
    with pytest.raises(RuntimeError, match="boom"), timings.collective("gather_weights"):
        raise RuntimeError("boom")
    assert _value(metrics, "streamrl_trainer_collective_seconds_total", rank="0", kind="gather_weights") > 0
