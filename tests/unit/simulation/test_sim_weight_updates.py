"""A simulated replica takes a version that arrives while sequences run as the generator's worker
does: by default once they finish, admitting nothing meanwhile (drain-then-update), and with
pipeline.inFlightUpdates at the next step, the running sequences going on with it."""

from __future__ import annotations

import pytest

from streamrl.simulation.events import Simulation, Track
from streamrl.simulation.replica import Sequence, SimReplica


class _StepCost:
    """Every decode step 1 s, prefill free."""

    max_batch = 4

    def decode_step_s(self, batch: int, context: int) -> float:
        return 1.0

    def prefill_s(self, tokens: int) -> float:
        return 0.0


def _run(in_flight: bool) -> tuple[list[tuple[float, int]], dict[str, tuple[float, int]]]:
    """Two sequences of 10 tokens from t=0; at t=3.5 version 1 arrives with two of 3 tokens:
    (time, version) of each load, prompt -> (finish time, version of its first token)."""
    sim = Simulation()
    loads: list[tuple[float, int]] = []
    done: dict[str, tuple[float, int]] = {}
    replica = SimReplica(sim, "g-0", "g", _StepCost(), 4, Track(sim, "g-0"),
                         lambda e, q: done.__setitem__(f"{q.prompt_id}/{q.index}", (sim.now, q.policy_version)),
                         lambda e, v: loads.append((sim.now, v)), in_flight_updates=in_flight)
    replica.give([Sequence("long", i, 10, 4, 0, 0.0) for i in range(2)])

    def arrive() -> None:
        replica.weights_fetched(1)
        replica.give([Sequence("short", i, 3, 4, 0, 0.0) for i in range(2)])

    sim.at(3.5, arrive)
    sim.run()
    return loads, done


def test_by_default_a_version_waits_for_the_running_sequences_and_so_does_new_work():
    loads, done = _run(in_flight=False)
    # The long ones' first token at admission (t=0), then 9 steps: they end at t=9; then v1, then the short.
    assert loads == [(pytest.approx(9.0), 1)]
    assert done["long/0"] == (pytest.approx(9.0), 0)
    assert done["short/0"] == (pytest.approx(11.0), 1)  # admitted at 9 on v1, 2 more steps


def test_in_flight_a_version_loads_at_the_next_step_and_new_work_starts_on_it():
    loads, done = _run(in_flight=True)
    assert loads == [(pytest.approx(4.0), 1)]
    assert done["short/0"] == (pytest.approx(6.0), 1)
    assert done["long/0"] == (pytest.approx(9.0), 0)  # first token v0: what staleness counts from
