"""Dispatch policies in the simulator, worked out by hand, and proof that the decisions are the
product's own functions: patching one of them in its service module changes the simulated run.

Two replicas decoding one sequence at a time (maxBatchSize 1), a step of 1 s, four one-sample
prompts of 2, 8, 3 and 9 output tokens (in that dataset order), batch mode, training free."""

from __future__ import annotations

import json

from streamrl.rollout.longtail import LongTailPlan
from streamrl.scaling.policy import Decision
from streamrl.simulation.scenario import parse_scenario
from streamrl.simulation.simulator import simulate


def _scenario(tmp_path, policy: str, iterations: int = 1, outputs=(2, 8, 3, 9), replicas: int = 2,
              max_batch: int = 1, **dispatch) -> dict:
    lengths = tmp_path / "lengths.jsonl"
    lengths.write_text("".join(json.dumps({"prompt_id": f"0-{k}-{k}", "lengths": [n]}) + "\n"
                               for k, n in enumerate(outputs)))
    return {
        "name": "policies", "pipeline": {"mode": "batch"},
        "algorithm": {"numIterations": iterations, "promptsPerStep": len(outputs), "groupSize": 1,
                      "microBatchSize": 4},
        "workload": {"promptTokens": 0, "maxNewTokens": 100, "lengths": {"type": "replay", "path": str(lengths)},
                     "rankerLogError": 0.0},
        "dispatch": {"policy": policy, **dispatch},
        "trainer": {"cost": {"type": "table", "secondsPerToken": 0.0}},
        "generators": [{"name": "g", "replicas": replicas,
                        "cost": {"type": "table", "decodeStepSeconds": [[1, 1.0]], "maxBatchSize": max_batch}}],
        "network": {"local": {"bandwidthGbps": 100, "latencyMs": 0}},
        "weights": {"sizeBytes": 1},
    }


def _generation_s(tmp_path, policy: str, **options) -> float:
    return simulate(parse_scenario(_scenario(tmp_path, policy, **options))).iterations[0].generation_s


def test_random_fifo_binds_work_early_in_dataset_order(tmp_path):
    # queueFactor 4: g-0 takes 2 and 3, g-1 takes 8 and 9 and runs them in turn: an L-token
    # sample alone takes L - 1 steps after its prefill, so g-1 ends at 7 + 8
    assert _generation_s(tmp_path, "random-fifo") == 15.0


def test_oracle_and_a_perfect_ranker_send_the_longest_first_and_bind_late(tmp_path):
    # longest first (9, 8, 3, 2), one prompt per replica at a time (queueFactor 1.25): 9 on g-0
    # until 8, 8 on g-1 until 7; g-1 then takes 3 (until 9) and g-0 takes 2 (until 9)
    assert _generation_s(tmp_path, "oracle") == 9.0
    assert _generation_s(tmp_path, "skewness-aware") == 9.0


def test_the_queue_order_is_the_products_dispatch_order(tmp_path, monkeypatch):
    from streamrl.rollout import workqueue

    monkeypatch.setattr(workqueue, "dispatch_order", lambda prompts: list(prompts))  # dataset order
    # 2 on g-0 (until 1), 8 on g-1 (until 7), 3 on g-0 (until 3), 9 on g-0 (until 11)
    assert _generation_s(tmp_path, "oracle") == 11.0


def test_in_replica_order_is_the_products_admission_key(tmp_path, monkeypatch):
    from streamrl.rollout import work

    # one replica decoding two at a time holds 9, 3 and 2 (queueFactor 4: all three at once);
    # longest first runs 9 and 3, then 2 from 2 to 3 beside 9, which ends at 8
    options = {"outputs": (2, 9, 3), "replicas": 1, "max_batch": 2, "queueFactor": 4}
    assert _generation_s(tmp_path, "oracle", **options) == 8.0
    monkeypatch.setattr(work, "admission_key", lambda priority, arrival: (priority, arrival))  # shortest first
    assert _generation_s(tmp_path, "oracle", **options) == 9.0  # 2 and 3 first; 9 from 1 to 9


def test_the_long_tail_split_is_the_products_planner(tmp_path, monkeypatch):
    from streamrl.rollout import longtail

    calls = []
    real = longtail.plan_long_tail

    def one_long_replica(demand, replicas, cap, objective="sum"):
        calls.append((demand, len(replicas)))
        real(demand, replicas, cap, objective)
        ids = sorted(r.replica_id for r in replicas)
        return LongTailPlan((ids[0],), tuple(ids[1:]), cap, 0.0, ())

    monkeypatch.setattr(longtail, "plan_long_tail", one_long_replica)
    # 9 (the top 20%) only on g-0, the rest on g-1: 8 until 7, 3 until 9, 2 until 10
    assert _generation_s(tmp_path, "oracle") == 10.0
    demand, n = calls[0]
    assert n == 2 and (demand.num_long_samples, demand.num_regular_samples) == (1, 3)
    assert (round(demand.long_length, 3), demand.regular_length) == (8.7, 5.5)  # P90 and P50 of 2, 3, 8, 9


def test_the_scaling_decision_is_the_products_round(tmp_path, monkeypatch):
    from streamrl.scaling import round as scaling_round

    data = _scenario(tmp_path, "random-fifo", iterations=30)
    data["trainer"]["cost"]["secondsPerToken"] = 1.0  # 36 s of training per iteration: training-bound
    data["generators"][0].update(maxReplicas=4, minReplicas=2, joinSeconds=5)
    data["autoscaling"] = {"mode": "Internal", "intervalSeconds": 60, "cooldownSeconds": 0}
    quiet = simulate(parse_scenario(data)).summary
    assert quiet.scale_ups == quiet.scale_downs == 0  # the real policy: nothing to add, nothing below minReplicas

    def always_add(obs, pools, behavior, state, now, *args):
        if pools[0].replicas >= pools[0].max_replicas:
            return Decision({p.name: p.replicas for p in pools}, "full", state=state)
        return Decision({pools[0].name: pools[0].replicas + 1}, "patched: add", 1, pools[0].name, state=state)

    monkeypatch.setattr(scaling_round, "decide", always_add)
    patched = simulate(parse_scenario(data)).summary
    assert patched.scale_ups == 2 and patched.replicas_final == {"g": 4}
    assert [r.reason for r in patched.scaling] == ["patched: add", "patched: add"]


def test_a_runs_recorded_predictions_stand_in_for_the_ranker(tmp_path):
    predictions = tmp_path / "predicted.jsonl"

    def generation_s(predicted: tuple[float, ...]) -> float:
        predictions.write_text("".join(json.dumps({"prompt_id": f"0-{k}-{k}", "lengths": [1], "predicted_length": v})
                                       + "\n" for k, v in enumerate(predicted)))
        data = _scenario(tmp_path, "skewness-aware")
        data["workload"]["rankerPredictions"] = str(predictions)
        return simulate(parse_scenario(data)).iterations[0].generation_s

    # Predictions in the true order (their scale does not matter) schedule as the perfect ranker.
    assert generation_s((20.0, 80.0, 30.0, 90.0)) == 9.0
    # A ranker that had it backwards sends the shortest first: 2 on g-0 (until 1), 3 on g-1
    # (until 2), 8 on g-0 (until 8), 9 on g-1 (until 10).
    assert generation_s((9.0, 3.0, 8.0, 2.0)) == 10.0


def test_a_predictions_file_without_predictions_is_refused_by_name(tmp_path):
    data = _scenario(tmp_path, "skewness-aware")
    data["workload"]["rankerPredictions"] = str(tmp_path / "lengths.jsonl")  # random-fifo's: no predictions
    try:
        simulate(parse_scenario(data))
    except ValueError as err:
        assert "workload.rankerPredictions" in str(err) and "no predicted_length" in str(err)
    else:
        raise AssertionError("a lengths.jsonl without predictions was taken as the ranker's")


def test_the_simulated_autoscaler_adds_a_whole_step_of_replicas(tmp_path):
    """Generation-bound (training nearly free, 8 sequences of up to 9 steps on 2 one-at-a-time
    replicas): with autoscaling.step 2 every change is two replicas, up to maxReplicas 6."""
    data = _scenario(tmp_path, "random-fifo", iterations=40, outputs=(2, 8, 3, 9, 5, 7, 4, 6))
    data["trainer"]["cost"]["secondsPerToken"] = 0.01
    data["generators"][0].update(maxReplicas=6, minReplicas=2, joinSeconds=1)
    data["autoscaling"] = {"mode": "Internal", "intervalSeconds": 30, "cooldownSeconds": 0, "step": 2,
                           "minUtilisation": 0.1}
    summary = simulate(parse_scenario(data)).summary
    assert [(r.step, r.replicas) for r in summary.scaling] == [(2, {"g": 4}), (2, {"g": 6})]
    assert summary.scale_ups == 2 and summary.replicas_final == {"g": 6}
    assert "2 more g replicas save" in summary.scaling[0].reason
