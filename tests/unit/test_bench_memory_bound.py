"""bench/sim_fidelity.py's memory-bound regime (64 H20-class replicas, 20K-token outputs of a
7B model) is a scenario the simulator must accept as the planner's memory model stands: run
here for its three iterations (seconds), so a change to the model that leaves it unresolvable fails a test, not
the bench at its end."""

from types import SimpleNamespace

from bench.sim_fidelity import memory_bound


def test_the_memory_bound_regime_simulates_and_ranks_the_dispatch_policies():
    out = memory_bound(SimpleNamespace(memory_iterations=3, ranker_log_error=0.5))
    assert out["replicas"] == 64 and out["length_p99_over_p50"] >= 8
    generation = out["generation_s"]
    assert set(generation) == {"random-fifo", "skewness-aware", "oracle"}
    # over the three iterations, predicted and true lengths both beat random placement
    assert generation["oracle"] <= generation["skewness-aware"] < generation["random-fifo"]
    assert 0 < out["oracle_over_random_fifo"] < 1
