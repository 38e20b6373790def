"""The rollout core's iteration rules, as values: what goes out when, the take rule of each
pipeline mode, the record's figures, and the predictions' long-tail split."""

import pytest

from streamrl.rollout.iteration import TAKE_MICRO_BATCHES, IterationPlanner, IterationTally
from streamrl.rollout.work import PromptWork
from streamrl.spec import DispatchSpec, PipelineMode, PipelineSpec


def _planner(mode=PipelineMode.stream_async, max_staleness=2, num_iterations=5, fraction=0.25):
    return IterationPlanner(PipelineSpec(mode=mode, max_staleness=max_staleness), num_iterations, 4,
                            DispatchSpec(long_tail_fraction=fraction))


def test_async_hands_out_staleness_iterations_ahead_and_never_past_the_last():
    planner = _planner()
    assert planner.due(0) == [0, 1, 2]
    assert planner.due(1) == [3]
    assert planner.due(2) == [4]
    assert planner.due(3) == []  # iteration 5 does not exist
    assert [planner.min_policy_version(j) for j in range(5)] == [0, 0, 0, 1, 2]


@pytest.mark.parametrize("mode", [PipelineMode.batch, PipelineMode.stream_sync])
def test_synchronous_modes_hand_out_one_iteration_at_a_time_on_policy(mode):
    planner = _planner(mode=mode)
    assert [planner.due(i) for i in range(3)] == [[0], [1], [2]]
    assert [planner.min_policy_version(j) for j in range(3)] == [0, 1, 2]


def test_a_resumed_run_hands_out_from_where_it_stopped():
    planner = _planner()
    planner.resume_at(3)
    assert planner.due(3) == [3, 4]


def test_predictions_split_the_long_tail_and_set_the_demand():
    planner = _planner(fraction=0.25)
    prompts = [PromptWork(f"p{i}", i, "", ()) for i in range(4)]
    lengths = {"p0": 10.0, "p1": 400.0, "p2": 30.0, "p3": 20.0}
    predicted = planner.predict(prompts, lengths)
    assert [(p.prompt_id, p.predicted_length, p.long_tail) for p in predicted] == [
        ("p0", 10.0, False), ("p1", 400.0, True), ("p2", 30.0, False), ("p3", 20.0, False)]
    assert (planner.demand.num_long_samples, planner.demand.num_regular_samples) == (4, 12)
    # no lengths observed yet: the targets come from the predictions; observed ones replace them
    first = planner.demand.long_length
    planner.observe([1000] * 8 + [5] * 8)
    planner.predict(prompts, lengths)
    assert planner.demand.long_length > first


def test_streaming_takes_a_micro_batch_at_a_time_and_batch_waits_for_everything():
    streaming = IterationTally.start(PipelineSpec(mode=PipelineMode.stream_sync, min_micro_batch_size=8), 10, 4, 16,
                                     now=100.0, idle_s=0.0, skewness_s=0.0)
    assert streaming.want() == (8, TAKE_MICRO_BATCHES * 16)
    streaming.took(36, now=103.0)
    assert streaming.want() == (4, TAKE_MICRO_BATCHES * 16)  # fewer than a micro-batch left
    assert streaming.generation_s == 0.0
    streaming.took(4, now=104.5)
    assert streaming.want() is None
    assert streaming.generation_s == 4.5

    batch = IterationTally.start(PipelineSpec(mode=PipelineMode.batch), 10, 4, 16, 0.0, 0.0, 0.0)
    assert batch.want() == (40, 40)


def test_the_close_gives_the_records_figures():
    tally = IterationTally.start(PipelineSpec(), 2, 2, 2, now=10.0, idle_s=3.0, skewness_s=1.0)
    tally.took(4, now=14.0)
    figures = tally.close(now=20.0, idle_s=5.0, skewness_s=9.0, replicas=2, lengths=[10, 20, 30, 60],
                          staleness=[0, 0, 1, 1])
    assert figures.wall_s == 10.0 and figures.generation_s == 4.0
    assert figures.samples_per_s == pytest.approx(0.4)
    assert figures.pipeline_bubble_ratio == pytest.approx(0.2)  # 2 s of 10 waiting for samples
    assert figures.skewness_bubble_ratio == pytest.approx(0.4)  # 8 s over 2 replicas x 10 s
    assert (figures.completion_tokens_mean, figures.completion_tokens_max) == (30.0, 60)
    assert (figures.staleness_mean, figures.staleness_max) == (0.5, 1)
