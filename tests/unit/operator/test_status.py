"""The phase machine, transition by transition."""

import pytest

from streamrl.operator.status import Observed, derive

NOW, LATER = "2026-12-02T10:00:00Z", "2026-12-02T10:05:00Z"
POOLS = [{"name": "l4", "cluster": "", "replicas": 2, "readyReplicas": 2}]
RUNNING = {"phase": "Running", "iteration": 3, "num_iterations": 10, "policy_version": 3, "samples_per_s": 100.0,
           "last": {"reward_mean": 0.5, "pipeline_bubble_ratio": 0.1}}


def conditions(status):
    return {c["type"]: c["status"] for c in status["conditions"]}


@pytest.mark.parametrize("obs, phase, true_conditions", [
    (Observed(1, invalid="spec.algorithm.groupSize: too small"), "Invalid", {"Failed", "ClustersReady"}),
    (Observed(1, pools=POOLS), "Pending", {"ClustersReady"}),
    (Observed(1, pools=POOLS, trainer=RUNNING), "Running", {"Ready", "Progressing", "ClustersReady"}),
    (Observed(1, pools=POOLS, trainer=RUNNING, suspended=True), "Suspended", {"Suspended", "Ready", "ClustersReady"}),
    (Observed(1, trainer_job={"succeeded": 1}), "Succeeded", {"Complete", "ClustersReady"}),
    (Observed(1, trainer_job={"conditions": [{"type": "Failed", "status": "True"}]}), "Failed",
     {"Failed", "ClustersReady"}),
    (Observed(1, pools=POOLS, cluster_problem="RLCluster 'west' is not registered"), "Pending", set()),
])
def test_phases(obs, phase, true_conditions):
    status = derive(obs, None, NOW)
    assert status["phase"] == phase
    assert {k for k, v in conditions(status).items() if v == "True"} == true_conditions
    assert status["observedGeneration"] == 1


def test_progress_and_transition_times():
    first = derive(Observed(4, pools=POOLS, trainer=RUNNING), None, NOW)
    assert first["trainer"] == {"ready": True, "iteration": 3, "policyVersion": 3, "reward": 0.5,
                                "pipelineBubbleRatio": 0.1, "samplesPerSecond": 100.0}
    assert first["generators"]["readyReplicas"] == 2 and first["message"] == "iteration 3 of 10"
    # An unchanged condition keeps its transition time; a changed one gets the new time.
    again = derive(Observed(4, pools=POOLS, trainer=RUNNING), first["conditions"], LATER)
    assert {c["type"]: c["lastTransitionTime"] for c in again["conditions"]}["Ready"] == NOW
    done = derive(Observed(4, pools=POOLS, trainer_job={"succeeded": 1}), again["conditions"], LATER)
    times = {c["type"]: c["lastTransitionTime"] for c in done["conditions"]}
    assert times["Complete"] == LATER and times["ClustersReady"] == NOW
