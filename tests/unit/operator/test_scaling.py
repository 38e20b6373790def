"""The operator's scaling driver (operator/src/scaling.py), one round, pure: window, waits (for the
replicas to settle), decisions and what follows from them (spec patch, status.autoscaling,
Events, the ScalingLimited reason)."""

import pytest

from streamrl.operator import scaling
from streamrl.operator.phases import JobPhase, Observed, derive
from streamrl.operator.scaling import Memory, plan, scale_patch, status_patch
from streamrl.scaling.inputs import Inputs, query_window_s
from streamrl.scaling.policy import Observation
from streamrl.spec import SpecError, parse_job

NOW = 1_800_000_000.0
SETTLED = Memory(settled_at=NOW - 60)
"""Every replica asked for connected a minute ago: four rounds of 15 s, the full window."""
URL = "http://prometheus:9090"
GEN_BOUND = Observation(generation_s=10.0, train_s=2.0)
TRAIN_BOUND = Observation(generation_s=1.0, train_s=10.0)


def job(replicas=1, min_replicas=1, max_replicas=3, **autoscaling):
    pool = {"name": "l4", "replicas": replicas, "minReplicas": min_replicas, "maxReplicas": max_replicas}
    return parse_job({"metadata": {"name": "j"}, "spec": {
        "model": {"source": "builtin-tiny"}, "generators": {"pools": [pool]},
        "autoscaling": {"mode": "Internal", **autoscaling,
                        "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0},
                                     "scaleDown": {"stabilizationWindowSeconds": 0}}}}})


def inputs(obs, connected=1, rate=20.0):
    return Inputs(obs, {"l4": rate}, {"l4": connected})


@pytest.mark.parametrize("settled_at, interval, expected", [
    (None, 15, 30.0),            # not settled: two rounds, read only for who is connected
    (NOW - 20, 15, 30.0),        # settled, but for less than two rounds: likewise
    (NOW - 40, 15, 40.0),        # since the replicas settled...
    (NOW - 5000, 15, 60.0),      # ...at most four rounds back
    (NOW - 5000, 2, 8.0),
])
def test_query_window_is_since_the_replicas_settled_within_two_to_four_rounds(settled_at, interval, expected):
    assert query_window_s(NOW, settled_at, interval) == expected


def test_prometheus_url_from_the_job_then_the_operator_else_a_clear_error():
    assert scaling.prometheus_url(job(prometheusUrl="http://mine:9090"), URL, ("http://mine",)) == "http://mine:9090"
    # A URL the operator was not allowed to read (it would make the request from its own network place).
    with pytest.raises(ValueError, match="spec.autoscaling.prometheusUrl http://10.0.0.1:8080 is not among the URLs "
                                         "the operator may read \\(http://mine; Helm value"):
        scaling.prometheus_url(job(prometheusUrl="http://10.0.0.1:8080"), URL, ("http://mine",))
    for sneaky in ("http://mine:9090@10.0.0.1:8080", "http://mine.attacker.example:9090", "https://mine:9090",
                   "http://mine:9091"):
        assert not scaling.url_allowed(sneaky, "http://mine:9090/"), sneaky
    assert scaling.url_allowed("http://mine:9090/prometheus/api", "http://mine:9090/prometheus")
    assert not scaling.url_allowed("http://mine:9090/prometheus-other", "http://mine:9090/prometheus")
    with pytest.raises(ValueError, match="none: it reads its own --prometheus-url only"):
        scaling.prometheus_url(job(prometheusUrl="http://mine:9090"), URL)
    assert scaling.prometheus_url(job(), URL) == URL
    with pytest.raises(ValueError, match=r"spec.autoscaling.prometheusUrl or the operator's --prometheus-url"):
        scaling.prometheus_url(job(), "")
    with pytest.raises(SpecError, match=r"spec.autoscaling.prometheusUrl: String should match pattern '\^https\?://'"):
        job(prometheusUrl="prometheus:9090")  # refused with the spec (and so by the CRD, at admission)


def test_generation_bound_adds_a_replica_with_an_event_and_a_recorded_decision():
    r = plan(job(), inputs(GEN_BOUND), SETTLED, NOW, URL)
    assert r.replicas == {"l4": 2}
    assert r.memory.settled_at is None  # the change is yet to join: the next window starts once it has
    [(kind, reason, message)] = r.events
    assert (kind, reason) == ("Normal", "ScaledUp")
    assert message.startswith("scaled pool l4 from 1 to 2: generation-bound")
    s = r.status
    assert s["mode"] == "Internal" and s["prometheusUrl"] == URL
    assert s["desiredReplicas"] == {"l4": 2} and s["lastScaleTime"] == scaling.timestamp(NOW)
    assert s["lastDecision"]["step"] == 1 and s["lastDecision"]["pool"] == "l4"
    assert s["inputs"] == {"windowSeconds": 60.0, "generationSeconds": 10.0, "trainSeconds": 2.0, "idleNoWork": 0.0,
                           "connected": {"l4": 1}, "samplesPerSecond": {"l4": 20.0}}
    assert s["limited"] is None


def test_min_utilisation_from_the_spec_is_honoured():
    # One more replica would halve generation to 1.5s: under training's 2s, so the published rule waits...
    close = inputs(Observation(generation_s=3.0, train_s=2.0))
    assert plan(job(), close, SETTLED, NOW, URL).replicas is None
    # ...unless generators may be busy only half the time.
    assert plan(job(minUtilisation=0.5), close, SETTLED, NOW, URL).replicas == {"l4": 2}


def test_idle_generators_lose_a_replica():
    # With one fewer generation would take 0.96 s, within training's 1 s (inside the 10% band,
    # so the idle time while work was out is what says the replica is spare).
    r = plan(job(replicas=2), inputs(Observation(0.48, 1.0, idle_no_work=0.6), connected=2), SETTLED, NOW, URL)
    assert r.replicas == {"l4": 1}
    assert [e[1] for e in r.events] == ["ScaledDown"]
    assert "idle for lack of work" in r.status["lastDecision"]["reason"]


@pytest.mark.parametrize("given, memory, says, settled_at", [
    (inputs(GEN_BOUND, connected=0), SETTLED,
     "waiting for the replicas asked for to connect: l4=0 connected, l4=1 asked for", None),
    (inputs(GEN_BOUND), Memory(), "waiting for 2 rounds (30s) of measurements since every replica asked for "
                                  "connected (l4=1): older data predates the last change", NOW),
    (inputs(GEN_BOUND), Memory(settled_at=NOW - 20), "waiting for 2 rounds (30s)", NOW - 20),
    (inputs(None), SETTLED, "waiting for two iterations to finish within the last 60s", SETTLED.settled_at),
])
def test_no_decision_until_the_replicas_settled_for_two_rounds_and_iterations_finished(given, memory, says, settled_at):
    previous = {"lastScaleTime": "2027-01-15T08:00:00Z", "desiredReplicas": {"l4": 1}, "limited": {"reason": "x"}}
    r = plan(job(), given, memory, NOW, URL, previous)
    assert r.replicas is None and r.decision is None and r.events == ()
    assert r.status["message"].startswith(says)
    assert r.memory.settled_at == settled_at  # a replica missing unsettles; the first complete round settles
    assert r.status["lastScaleTime"] == "2027-01-15T08:00:00Z"  # carried over
    assert "limited" not in r.status  # a waiting round says nothing about limits


def test_rounds_after_a_change_settle_then_measure_two_rounds_then_decide():
    j = job(replicas=2)
    joining = plan(j, inputs(GEN_BOUND, connected=1), Memory(), NOW, URL)  # the replica added is starting
    assert joining.memory.settled_at is None
    r = plan(j, inputs(GEN_BOUND, connected=2), joining.memory, NOW + 15, URL)
    assert r.memory.settled_at == NOW + 15 and r.decision is None
    r = plan(j, inputs(GEN_BOUND, connected=2), r.memory, NOW + 30, URL)
    assert r.decision is None and r.status["inputs"]["windowSeconds"] == 30.0  # one round: still too short
    r = plan(j, inputs(GEN_BOUND, connected=2), r.memory, NOW + 45, URL)
    assert r.replicas == {"l4": 3} and r.status["inputs"]["windowSeconds"] == 30.0
    assert r.memory.settled_at is None  # measured afresh once the next replica joined


def test_trainer_bound_at_the_minimum_warns_once_and_is_a_limit():
    first = plan(job(replicas=1, min_replicas=1), inputs(TRAIN_BOUND), SETTLED, NOW, URL)
    assert first.replicas is None
    assert first.status["trainerBound"] is True
    assert [(e[0], e[1]) for e in first.events] == [("Warning", "TrainerBound")]
    assert first.status["limited"]["reason"] == "TrainerBound"
    again = plan(job(replicas=1, min_replicas=1), inputs(TRAIN_BOUND), first.memory, NOW + 15, URL)
    assert again.events == () and again.status["trainerBound"] is True


def test_generation_bound_with_every_pool_at_its_maximum_is_a_limit():
    r = plan(job(replicas=3, max_replicas=3), inputs(GEN_BOUND, connected=3), SETTLED, NOW, URL)
    assert r.replicas is None
    assert r.status["limited"]["reason"] == "AtMaxReplicas"
    assert "maxReplicas (l4=3)" in r.status["limited"]["message"]


def test_scale_patch_writes_every_pool_and_the_total_guarded_by_the_resource_version():
    body = {"metadata": {"resourceVersion": "42"}, "spec": {"generators": {"pools": [
        {"name": "l4", "replicas": 2, "engine": {"type": "torch"}}, {"replicas": 1}]}}}
    patch = scale_patch(body, {"l4": 3, "default": 1})
    # the total follows the pools (the annotation says the operator derived it from them)
    assert patch == {"metadata": {"resourceVersion": "42", "annotations": {"streamrl.io/replicas-from-pools": "4"}},
                     "spec": {"generators": {
        "pools": [{"name": "l4", "replicas": 3, "engine": {"type": "torch"}}, {"replicas": 1}], "replicas": 4}}}
    assert body["spec"]["generators"]["pools"][0]["replicas"] == 2  # the read object is not changed


def test_status_patch_replaces_autoscaling_and_skips_no_ops():
    old = {"mode": "Internal", "message": "a", "limited": {"reason": "TrainerBound", "message": "m"},
           "inputs": {"connected": {"l4": 1, "gone": 2}}}
    new = {"mode": "Internal", "message": "b", "inputs": {"connected": {"l4": 1}}, "limited": None}
    assert status_patch(old, new) == {"status": {"autoscaling": {
        "message": "b", "limited": None, "inputs": {"connected": {"gone": None}}}}}
    assert status_patch(new, dict(new)) is None
    assert status_patch(old, None) == {"status": {"autoscaling": None}}
    assert status_patch(None, None) is None
    assert status_patch(None, scaling.external_status()) == {"status": {"autoscaling": {
        "mode": "External", "message": scaling.EXTERNAL}}}


def test_memory_after_a_restart_is_unsettled_and_remembers_trainer_bound():
    memory = Memory.from_status({"lastScaleTime": scaling.timestamp(NOW - 5000), "trainerBound": True})
    assert memory == Memory(settled_at=None, trainer_bound=True)  # re-settles in two rounds
    assert Memory.from_status(None) == Memory()


def test_skip_suspended_and_finished_jobs():
    assert scaling.skip_reason(job(), JobPhase.RUNNING) is None
    assert scaling.skip_reason(job(), None) is None  # before the first status
    suspended = parse_job({"spec": {"model": {"source": "builtin-tiny"}, "suspend": True}})
    assert "suspend" in scaling.skip_reason(suspended, JobPhase.SUSPENDED)
    for phase in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.INVALID):
        assert scaling.skip_reason(job(), phase) == f"the job is {phase.value}: nothing to scale"


def test_scaling_limited_condition_carries_the_reason():
    def limited(status):
        return {c["type"]: c for c in status["conditions"]}["ScalingLimited"]

    c = limited(derive(Observed(1, scaling_limited=("AtMaxReplicas", "every pool at max")), None, "t"))
    assert (c["status"], c["reason"], c["message"]) == ("True", "AtMaxReplicas", "every pool at max")
    assert limited(derive(Observed(1), None, "t"))["status"] == "False"
