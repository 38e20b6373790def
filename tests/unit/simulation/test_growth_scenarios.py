"""7B on 32 H800 with outputs doubling over 24 iterations, generators growing by nodes
(deploy/scenarios/qwen2.5-7b-growth*.yaml): from the planned split both stages grow in
proportion and the trainer stays the bottleneck, so the autoscaler rightly adds nothing; from
a split short of generators it adds a node whenever generation is the slower stage, up to
its maximum, and the run makes more samples per second (docs/simulation.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl.simulation.scenario import load_scenario
from streamrl.simulation.simulator import SimRun, simulate

SCENARIOS = Path(__file__).resolve().parents[3] / "deploy" / "scenarios"


@pytest.fixture(scope="module")
def planned() -> SimRun:
    return simulate(load_scenario(SCENARIOS / "qwen2.5-7b-growth.yaml"))


@pytest.fixture(scope="module")
def short() -> SimRun:
    return simulate(load_scenario(SCENARIOS / "qwen2.5-7b-growth-short.yaml"))


def test_from_the_planned_split_both_stages_grow_alike_and_nothing_is_added(planned):
    its = planned.iterations
    assert its[-1].completion_tokens_mean > 1.6 * its[1].completion_tokens_mean  # outputs grow
    for it in its[1:]:  # generation keeps just under training all along
        assert 0.9 * it.train_s < it.generation_s < it.train_s
    assert its[-1].train_s > 1.4 * its[1].train_s and its[-1].generation_s > 1.4 * its[1].generation_s
    s = planned.summary
    assert s.scale_ups == s.scale_downs == 0 and s.replicas_final == {"h800": 7}
    assert s.pipeline_bubble_ratio < 0.02
    assert next(u for u in s.stages if u.name == "trainer").utilisation > 0.95


def test_short_of_generators_the_autoscaler_adds_a_node_while_generation_is_slower(short, planned):
    s = short.summary
    assert [(r.step, r.replicas) for r in s.scaling] == [(2, {"h800": 8}), (2, {"h800": 10})]
    assert all("generation-bound" in r.reason and r.generation_s > r.train_s for r in s.scaling)
    assert s.replicas_final == {"h800": 10} and s.scale_downs == 0
    assert s.samples_per_s > 1.3 * planned.summary.samples_per_s
