"""Scenario files and what the simulator makes of them at scale: the shipped examples, errors
that name the field, one weight copy over the cross-datacenter link, drifting lengths, the
elastic policy, and a 64-replica, 20K-token run that simulates in seconds."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from streamrl.cli import main
from streamrl.simulation.outcome import ITERATIONS_FILE, SUMMARY_FILE, SimIteration, SimSummary
from streamrl.simulation.scenario import load_scenario, parse_scenario
from streamrl.simulation.simulator import simulate
from streamrl.spec import SpecError
from tests.unit.simulation.handworked import complete_group

SCENARIOS = Path(__file__).resolve().parents[3] / "deploy" / "scenarios"


def _table(replicas: int = 4, **extra) -> dict:
    return {
        "name": "t", "pipeline": {"mode": "stream-sync"},
        "algorithm": {"numIterations": 4, "promptsPerStep": 16, "groupSize": 4, "microBatchSize": 8},
        "workload": {"promptTokens": 16, "maxNewTokens": 256, "lengths": {"type": "lognormal", "median": 40}},
        "trainer": {"cost": {"type": "table", "secondsPerToken": 1e-4, "stepSeconds": 0.05}},
        "generators": [{"name": "g", "replicas": replicas,
                        "cost": {"type": "table", "decodeStepSeconds": [[1, 0.01], [16, 0.02]], "maxBatchSize": 16}}],
        "weights": {"sizeBytes": 1e8},
        **extra,
    }


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_the_shipped_scenarios_simulate(path):
    scenario = load_scenario(path, iterations=3)
    summary = simulate(scenario, base=path.parent).summary
    assert summary.num_iterations == 3 and summary.samples_per_s > 0
    assert 0 <= summary.pipeline_bubble_ratio <= 1 and 0 <= summary.skewness_bubble_ratio <= 1
    assert summary.cost > 0 and all(0 <= s.utilisation <= 1 for s in summary.stages)


@pytest.mark.parametrize(("change", "field", "words"), [
    (lambda d: d["generators"][0].update(cots=1), "generators[0].cots", "unknown field"),
    (lambda d: d.update(model="qwen2.5-7b") or d["generators"][0].update(cost={"type": "analytic", "gpu": "H2O"}),
     "generators[0].cost.gpu", "not in the GPU catalog"),
    (lambda d: d.update(model="qwen2.5-72b") or d["generators"][0].update(cost={"type": "analytic", "gpu": "L4"}),
     "generators[0].cost", "needs"),
    (lambda d: d["generators"][0].update(cost={"type": "analytic", "gpu": "H20"}), "generators[0].cost",
     "needs the scenario's `model`"),
    (lambda d: d.update(weights={}), "weights.sizeBytes", "required"),
    (lambda d: d.update(trainer={"cost": {"type": "profile", "path": "/nonexistent.json"}}), "trainer.cost.path",
     "no such file"),
    (lambda d: d["workload"]["lengths"].update(median=-1), "workload.lengths.median", "greater than 0"),
    (lambda d: d["pipeline"].update(mode="streaming"), "pipeline.mode", "colocated"),
])
def test_a_bad_scenario_is_refused_naming_the_field(change, field, words):
    data = _table()
    change(data)
    with pytest.raises((SpecError, ValueError)) as err:
        simulate(parse_scenario(data))
    assert field in str(err.value) and words in str(err.value)


def test_the_command_line_names_the_field_and_writes_the_run(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nworkload: {lengths: {type: lognormal, median: 10}}\ntrainer: {}\ngenerators: []\n")
    assert main(["simulate", str(bad)]) == 2
    assert "trainer.cost: Field required" in capsys.readouterr().err
    out = tmp_path / "out"
    assert main(["simulate", str(SCENARIOS / "two-replicas.yaml"), "--mode", "stream-async", "--out", str(out)]) == 0
    assert "two-replicas: stream-async" in capsys.readouterr().out
    summary = SimSummary.read(out / SUMMARY_FILE)
    records = SimIteration.read_lines(out / ITERATIONS_FILE)
    assert summary.mode == "stream-async" and len(records) == summary.num_iterations == 3
    assert summary.samples_per_s == pytest.approx(12 / sum(r.wall_s for r in records))
    assert (out / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_weight_copy_crosses_the_datacenter_link_when_the_pool_relays():
    data = _table(network={"crossDatacenter": {"bandwidthGbps": 1, "latencyMs": 20}})
    data["generators"][0]["datacenter"] = "far"
    relayed_run = simulate(parse_scenario(data))
    data["generators"][0]["weightRelay"] = False
    direct_run = simulate(parse_scenario(data))
    relayed, direct = relayed_run.summary, direct_run.summary
    versions = relayed.weight_bytes_cross_datacenter / 1e8
    assert versions == 3  # versions 1-3 used (the last one published is still travelling)
    assert direct.weight_bytes_cross_datacenter == 4 * relayed.weight_bytes_cross_datacenter
    assert relayed.weight_bytes_local == 3 * 3e8  # fanned out by the pool's seed
    # 0.8 s per copy over the slow link: the last of four queued copies arrives after 3.2 s
    relayed_sync = max(r.weight_sync_s_max for r in relayed_run.iterations)
    direct_sync = max(r.weight_sync_s_max for r in direct_run.iterations)
    assert 0.82 < relayed_sync < 0.9 and 3.22 <= direct_sync < 3.3
    assert direct.iteration_s_mean > relayed.iteration_s_mean + 1.0


def test_output_lengths_drift_as_asked():
    data = _table(workload={"promptTokens": 16, "maxNewTokens": 100000, "medianGrowthPerIteration": 0.5,
                            "lengths": {"type": "lognormal", "median": 40, "sigma": 0.0}})
    run = simulate(parse_scenario(data))
    assert [r.completion_tokens_mean for r in run.iterations] == [40, 60, 90, 135]
    assert run.iterations[-1].generation_s > 2 * run.iterations[0].generation_s


def test_linear_growth_adds_the_same_share_of_the_first_length_each_iteration():
    data = _table(workload={"promptTokens": 16, "maxNewTokens": 100000, "medianGrowthPerIteration": 0.5,
                            "growth": "linear", "lengths": {"type": "lognormal", "median": 40, "sigma": 0.0}})
    run = simulate(parse_scenario(data))
    assert [r.completion_tokens_mean for r in run.iterations] == [40, 60, 80, 100]


def test_prompt_lengths_spread_over_prompts_and_each_prompt_is_prefilled_and_trained_as_long_as_it_is():
    from streamrl.simulation.simulator import padded_tokens
    from streamrl.simulation.workload import SimWorkload

    def workload(**extra):
        data = _table(workload={"promptTokens": 100, "maxNewTokens": 256, "lengths": {"type": "lognormal",
                                                                                          "median": 40}, **extra})
        return data, SimWorkload(parse_scenario(data).workload, 64, 4, seed=0)

    _, fixed = workload()
    data, spread = workload(promptTokensSigma=1.0, maxPromptTokens=400)
    drawn = [p.prompt_tokens for j in range(4) for p in spread.iteration(j)]
    assert {p.prompt_tokens for p in fixed.iteration(0)} == {100}
    assert min(drawn) >= 1 and max(drawn) == 400  # clipped
    assert 70 < sorted(drawn)[len(drawn) // 2] < 140  # lognormal around the median
    # the outputs drawn are the same with and without the spread (prompt lengths have their own stream)
    assert [p.lengths for p in spread.iteration(1)] == [p.lengths for p in fixed.iteration(1)]
    # each prompt trained with its own tokens: batch mode takes the iteration at once, its
    # micro-batches of 8 padded to their longest, 1e-4 s per token plus the 0.05 s step
    data["pipeline"]["mode"] = "batch"
    data["generators"][0]["cost"]["prefillSecondsPerToken"] = 1e-3
    scenario = parse_scenario(data)
    groups = [complete_group(p.prompt_id, p.prompt_tokens, p.lengths)
              for p in SimWorkload(scenario.workload, 16, 4, seed=scenario.seed).iteration(0)]
    spread_run = simulate(scenario)
    assert spread_run.iterations[0].train_s == pytest.approx(padded_tokens(groups, 8) * 1e-4 + 0.05)
    data["workload"]["promptTokensSigma"] = 0.0
    fixed_run = simulate(parse_scenario(data))
    assert spread_run.iterations[0].generation_s != fixed_run.iterations[0].generation_s  # prefill differs


def test_the_elastic_policy_adds_replicas_as_generation_falls_behind():
    data = _table(replicas=2, workload={"promptTokens": 16, "maxNewTokens": 4000, "medianGrowthPerIteration": 0.1,
                                        "lengths": {"type": "lognormal", "median": 100, "sigma": 0.3}})
    data["algorithm"]["numIterations"] = 30
    data["trainer"]["cost"]["secondsPerToken"] = 2e-4
    data["generators"][0].update(minReplicas=2, maxReplicas=8, joinSeconds=1.0)
    data["autoscaling"] = {"mode": "Internal", "intervalSeconds": 5, "cooldownSeconds": 10}
    run = simulate(parse_scenario(data))
    s = run.summary
    assert s.scale_ups >= 2 and s.scale_downs == 0 and s.replicas_final["g"] == 2 + s.scale_ups
    assert all(r.step == 1 and r.generation_s > r.train_s for r in s.scaling)  # each one generation-bound
    assert run.iterations[-1].replicas == s.replicas_final["g"]
    times = [r.time_unix for r in s.scaling]
    assert times == sorted(times) and math.isfinite(times[-1])
    # an added replica's GPU is paid from the decision (joinSeconds before it says hello) to the end
    pool = next(st for st in s.stages if st.name == "g")
    assert pool.gpu_seconds == pytest.approx(2 * s.makespan_s + sum(s.makespan_s - t for t in times))


def test_sixty_four_memory_bound_replicas_and_20k_token_outputs_simulate_in_seconds():
    data = {
        "name": "scale", "model": "qwen2.5-32b", "pipeline": {"mode": "stream-async"},
        "algorithm": {"numIterations": 2, "promptsPerStep": 512, "groupSize": 16, "microBatchSize": 2},
        "workload": {"promptTokens": 512, "maxNewTokens": 20000,
                     "lengths": {"type": "lognormal", "median": 1500, "sigma": 0.9}},
        "trainer": {"gpus": 64, "cost": {"type": "analytic", "gpu": "H800", "activationCheckpointing": True}},
        "generators": [{"name": "h20", "replicas": 64, "cost": {"type": "analytic", "gpu": "H20",
                                                                 "tensorParallel": 2}}],
    }
    t0 = time.perf_counter()
    fifo = simulate(parse_scenario(data)).summary
    took = time.perf_counter() - t0
    data["dispatch"] = {"policy": "oracle"}
    oracle = simulate(parse_scenario(data)).summary
    assert fifo.num_samples == 2 * 512 * 16
    assert took < 30, f"{took:.1f}s"
    # memory-bound decoding: sending the long tail first to replicas that free slots first wins
    assert oracle.generation_s_mean < 0.95 * fifo.generation_s_mean
