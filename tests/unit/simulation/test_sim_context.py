"""A simulated replica asks its cost for a step at the batch's mean context, or at its longest
where the engine attends every sequence over the longest one's context (padded attention, the
torch engine's slot cache): each stretch of steps at its middle step. It keeps its PTL(BS) as a
replica does (start-up points, then served steps smoothed into their buckets) and reports it to
the coordinator every load-report interval, so the long-tail planner sees what it would."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from streamrl.latency import observe_ptl
from streamrl.simulation.events import Simulation, Track
from streamrl.simulation.replica import Sequence, SimReplica
from streamrl.simulation.scenario import parse_scenario
from streamrl.simulation.simulator import Simulator
from streamrl.simulation.stages import resolve_stages


@dataclass
class _FakeCost:
    padded_attention: bool
    max_batch: int = 2
    asked: list[tuple[int, int]] = field(default_factory=list)

    def decode_step_s(self, batch: int, context: int) -> float:
        self.asked.append((batch, context))
        return 1.0

    def prefill_s(self, tokens: int) -> float:
        return 0.0


def _contexts(padded: bool) -> list[tuple[int, int]]:
    sim, cost, done = Simulation(), _FakeCost(padded), []
    replica = SimReplica(sim, "g-0", "g", cost, 2, Track(sim, "g-0"), lambda e, q: done.append(q.length),
                         lambda e, v: None)
    replica.give([Sequence("p", i, n, 0, 0, 0.0) for i, n in enumerate((4, 10, 6))])
    sim.run()
    assert done == [4, 6, 10]
    return cost.asked


@pytest.mark.parametrize("padded, second", [(False, (2, 4)), (True, (2, 6))])
def test_each_stretch_is_priced_at_its_middle_steps_context(padded, second):
    # [4, 10] decode 3 steps at contexts 1..3 (middle 2); then 10 (at 4) beside 6 (admitted, at 1) for
    # 5 steps: middle mean 2.5 + 2 = 4.5 (rounds to 4), longest 4 + 2 = 6; then 10 alone at 9 for 1 step
    assert _contexts(padded) == [(2, 2), second, (1, 9)]


def test_served_steps_are_smoothed_into_their_power_of_two_bucket():
    points: dict[int, float] = {}
    observe_ptl(points, 5, 1.0)
    assert points == {4: 1.0}  # 5 counts toward 4; a first step sets it
    observe_ptl(points, 7, 2.0, steps=2)  # two steps, each weighing 0.1
    assert points[4] == pytest.approx(1.0 * 0.81 + 2.0 * 0.19)
    observe_ptl(points, 3, 0.5)
    observe_ptl(points, 100, 0.5)
    assert sorted(points) == [3, 4, 64]


def test_replicas_report_the_ptl_of_the_steps_they_served(tmp_path):
    lengths = tmp_path / "lengths.jsonl"
    lengths.write_text(json.dumps({"prompt_id": "0-0-0", "lengths": [4, 10]}) + "\n"
                       + json.dumps({"prompt_id": "0-1-1", "lengths": [6, 6]}) + "\n")
    scenario = parse_scenario({
        "pipeline": {"mode": "batch"},
        "algorithm": {"numIterations": 1, "promptsPerStep": 2, "groupSize": 2, "microBatchSize": 4},
        "workload": {"promptTokens": 0, "maxNewTokens": 100, "lengths": {"type": "replay", "path": str(lengths)}},
        "trainer": {"cost": {"type": "table", "secondsPerToken": 0.1}},
        "generators": [{"name": "g", "replicas": 2, "cost": {
            "type": "table", "decodeStepSeconds": [[1, 1.0]], "contextSecondsPerToken": 0.01, "maxBatchSize": 4}}],
        "weights": {"sizeBytes": 1e6}})
    sim = Simulator(scenario, resolve_stages(scenario))
    fleet = sim.fleet  # start-up points at the typical context: prompt 0 + half the median output (6) = 3
    sim.run()
    # g-0: 3 steps of 2 sequences at context 2 (1.04 s), reported at 3.12; then 6 steps of 1 at context 6
    # (1.06 s), reported at 9.48
    two = 1.06 * 0.9**3 + 1.04 * (1 - 0.9**3)
    one = 1.03 * 0.9**6 + 1.06 * (1 - 0.9**6)
    assert dict(fleet.replicas["g-0"].latency_profile) == pytest.approx({1: one, 2: two, 4: 1.12})
    # g-1 served [6, 6] at context 3, as its start-up point said: unchanged
    assert dict(fleet.replicas["g-1"].latency_profile) == pytest.approx({1: 1.03, 2: 1.06, 4: 1.12})
