"""A simulated replica asks its cost for a step at the batch's mean context, or at its longest
where the engine attends every sequence over the longest one's context (padded attention, the
torch engine's slot cache): each stretch of steps at its middle step."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from streamrl.planning.decoding import Sequence, SimReplica
from streamrl.planning.events import Simulation, Track


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
