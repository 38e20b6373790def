"""A run that outlives its trainer pods, on the real operator against an emulated API server:
the checkpoint claim (created with its size, class and access mode, or an existing one)
mounted as every trainer pod's run directory and kept after the job unless told otherwise;
the restart budget from the spec; preemptions and suspensions restarted without spending it;
the status and the one Resumed Event after a simulated restart, read from a real /status."""

from __future__ import annotations

import asyncio

import pytest

from streamrl.admin import AdminServer
from streamrl.metrics import ServiceMetrics
from streamrl.records import CheckpointInfo, TrainerPhase
from tests.integration.operator.conftest import wait_for
from tests.integration.operator.test_operator import (
    CONFIGMAPS,
    JOBS,
    NS,
    RLJOB,
    _fetch_from,
    create,
    example,
    get,
    plain,
)
from tests.integration.operator.test_trainer_group import fail, sharded, status, trainer_job
from tests.unit.operator.trainer_bodies import trainer_status

CLAIMS = "v1/persistentvolumeclaims"
OUT = "/var/lib/streamrl/out"


@pytest.fixture
def kopf_settings(kopf_settings):
    kopf_settings.posting.enabled = True  # the Resumed Event is part of what is checked
    return kopf_settings


def with_volume(body: dict, **volume) -> dict:
    body["spec"]["checkpoint"] = {"everyIterations": 5, "volume": volume}
    return body


def claim(k8s, name: str) -> dict:
    return get(k8s, CLAIMS, name)


def claims(k8s) -> list[str]:
    return [key[2] for key, obj in k8s.objects.items() if key[0] == CLAIMS and not obj.deleted]


def run_directory(k8s, job: str) -> tuple[dict, str]:
    """(the trainer pod template's `out` volume, where its container mounts it)."""
    pod = trainer_job(k8s, job)["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "out"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "out"]
    return plain(volume), mount["mountPath"]


def events(k8s, name: str, reason: str) -> list[tuple[str, str]]:
    """(type, message) of the Events with `reason` posted on one RLJob."""
    return [(e["type"], e["message"]) for key, e in k8s.objects.items()
            if key[0] == "v1/events" and not e.deleted and e["involvedObject"]["name"] == name
            and e["reason"] == reason]


async def test_the_claim_is_created_with_its_size_class_and_mode_and_mounted_in_every_trainer_pod(k8s, operator):
    await create(k8s, with_volume(sharded("ckpt", nodes=3), size="500Gi", storageClass="filestore-rwx"))
    await wait_for(lambda: claim(k8s, "ckpt-checkpoints"), what="the checkpoint claim")
    spec = claim(k8s, "ckpt-checkpoints")["spec"]
    assert plain(spec) == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "500Gi"}},
                           "storageClassName": "filestore-rwx"}  # three nodes write their shards into it
    assert "ownerReferences" not in claim(k8s, "ckpt-checkpoints")["metadata"]  # retained after the job
    await wait_for(lambda: trainer_job(k8s, "ckpt"), what="the trainer Job")
    assert run_directory(k8s, "ckpt") == ({"name": "out", "persistentVolumeClaim": {"claimName": "ckpt-checkpoints"}},
                                          OUT)
    args = trainer_job(k8s, "ckpt")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--out") + 1] == OUT
    assert trainer_job(k8s, "ckpt")["spec"]["completions"] == 3  # one template: every pod mounts it

    first = get(k8s, RLJOB, "ckpt")["metadata"]["uid"]
    assert claim(k8s, "ckpt-checkpoints")["metadata"]["annotations"] == {"streamrl.io/job-uid": first}


async def test_a_recreated_job_never_resumes_from_the_earlier_jobs_claim_unless_told_to(k8s, operator):
    """N8: the retained claim outlives its job; a new RLJob of the same name (the CRD tells users
    to create one to change an immutable field) would resume from it or refuse it as another
    job's and fail. It is refused, saying so, until the user annotates the job to adopt it."""
    await create(k8s, with_volume(example("ckpt"), size="50Gi"))
    await wait_for(lambda: trainer_job(k8s, "ckpt"), what="the trainer Job")
    uid = claim(k8s, "ckpt-checkpoints")["metadata"]["uid"]
    await k8s.delete(f"{JOBS}/ckpt")
    await wait_for(lambda: get(k8s, RLJOB, "ckpt").deleted, what="the RLJob deleted")
    await wait_for(lambda: get(k8s, CONFIGMAPS, "ckpt-spec").deleted, what="its children collected")
    await create(k8s, with_volume(example("ckpt"), size="50Gi"))
    await wait_for(lambda: "holds the checkpoints of an earlier RLJob" in status(k8s, "ckpt").get("message", ""),
                   what="the status names the claim")
    assert "streamrl.io/adopt-checkpoints=true" in status(k8s, "ckpt")["message"]
    assert ("batch/v1/jobs", NS, "ckpt-trainer") not in k8s.objects or trainer_job(k8s, "ckpt").deleted
    adopt = {"metadata": {"annotations": {"streamrl.io/adopt-checkpoints": "true"}}}
    resp = await k8s.patch(f"{JOBS}/ckpt", json=adopt)
    assert resp.status == 200
    await wait_for(lambda: not trainer_job(k8s, "ckpt").deleted, what="the trainer Job, adopting the claim")
    second = get(k8s, RLJOB, "ckpt")["metadata"]["uid"]
    assert claim(k8s, "ckpt-checkpoints")["metadata"]["annotations"]["streamrl.io/job-uid"] == second
    assert claim(k8s, "ckpt-checkpoints")["metadata"]["uid"] == uid and claims(k8s) == ["ckpt-checkpoints"]


async def test_an_existing_claim_is_mounted_none_is_created_and_a_missing_one_is_said(k8s, operator):
    await create(k8s, with_volume(example("team"), claimName="team-ckpt"))
    await wait_for(lambda: "team-ckpt" in status(k8s, "team")["message"], what="the missing claim said")
    assert (status(k8s, "team")["phase"], status(k8s, "team")["message"]) == (
        "Pending", "checkpoint.volume.claimName: PersistentVolumeClaim 'team-ckpt' not found in namespace rl; "
                   "the trainer's pods wait for it")
    assert run_directory(k8s, "team") == ({"name": "out", "persistentVolumeClaim": {"claimName": "team-ckpt"}}, OUT)
    resp = await k8s.post(f"/api/v1/namespaces/{NS}/persistentvolumeclaims", json={
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "team-ckpt", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    assert resp.status in (200, 201), await resp.text()
    await wait_for(lambda: "team-ckpt" not in status(k8s, "team")["message"], what="the claim found")
    assert claims(k8s) == ["team-ckpt"]  # the operator made none
    assert "ownerReferences" not in claim(k8s, "team-ckpt")["metadata"]  # and owns none it did not make


async def test_a_claim_not_retained_is_owned_by_the_job(k8s, operator):
    await create(k8s, with_volume(example("scratch"), size="5Gi", retain=False))
    await wait_for(lambda: claim(k8s, "scratch-checkpoints"), what="the checkpoint claim")
    [owner] = claim(k8s, "scratch-checkpoints")["metadata"]["ownerReferences"]
    job = get(k8s, RLJOB, "scratch")
    assert (owner["kind"], owner["name"], owner["uid"]) == ("RLJob", "scratch", job["metadata"]["uid"])
    assert claim(k8s, "scratch-checkpoints")["spec"]["accessModes"] == ["ReadWriteOnce"]  # one trainer pod
    # Asked to keep it after all: the owner reference goes, the claim stays.
    spec = plain(job["spec"])
    spec["checkpoint"]["volume"]["retain"] = True
    resp = await k8s.patch(f"{JOBS}/scratch", json={"spec": spec})
    assert resp.status == 200
    await wait_for(lambda: not claim(k8s, "scratch-checkpoints")["metadata"].get("ownerReferences"),
                   what="the owner reference removed")


async def test_the_restart_budget_comes_from_the_spec(k8s, operator):
    body = sharded("budget", nodes=2)
    body["spec"]["trainer"]["restartLimit"] = 1
    assert operator.settings.trainer_backoff_limit == 2  # the spec's 1 wins
    await create(k8s, body)
    await wait_for(lambda: status(k8s, "budget")["trainer"]["expectedPods"] == 2, what="status written")
    uid = trainer_job(k8s, "budget")["metadata"]["uid"]
    await fail(k8s, "budget", "Container main for pod rl/budget-trainer-1-x7k2p failed with exit code 1 matching "
                              "FailJob rule at index 2")
    await wait_for(lambda: trainer_job(k8s, "budget")["metadata"]["uid"] != uid, what="the group restarted")
    await wait_for(lambda: status(k8s, "budget")["trainer"]["restarts"] == 1, what="one restart counted")
    await fail(k8s, "budget", "Container main for pod rl/budget-trainer-0-q9z8m failed with exit code 137 matching "
                              "FailJob rule at index 2")
    await wait_for(lambda: status(k8s, "budget")["phase"] == "Failed", what="Failed on the second failure")
    assert status(k8s, "budget")["message"] == (
        "the trainer group failed after 1 restart(s) (budget 1): Container main for pod rl/budget-trainer-0-q9z8m "
        "failed with exit code 137 matching FailJob rule at index 2; generators and ranker scaled to 0 (to train "
        "again, create the RLJob anew)")


async def test_preemptions_and_disruptions_restart_the_group_without_spending_the_budget(k8s, operator):
    body = sharded("spot", nodes=2)
    body["spec"]["trainer"]["restartLimit"] = 0  # any counted failure would end the job
    await create(k8s, body)
    await wait_for(lambda: status(k8s, "spot")["trainer"]["expectedPods"] == 2, what="status written")
    why = ["Container main for pod rl/spot-trainer-0-ab12c failed with exit code 75 matching FailJob rule at index 0",
           "Pod rl/spot-trainer-1-de34f has condition DisruptionTarget matching FailJob rule at index 1"]
    for n, message in enumerate(why, start=1):
        uid = trainer_job(k8s, "spot")["metadata"]["uid"]
        await fail(k8s, "spot", message)
        await wait_for(lambda old=uid: trainer_job(k8s, "spot")["metadata"]["uid"] != old and
                       not trainer_job(k8s, "spot").get("status"), what=f"the group restarted ({message})")
        await wait_for(lambda n=n: status(k8s, "spot")["trainer"]["preemptions"] == n, what="a preemption counted")
        assert status(k8s, "spot")["trainer"]["restarts"] == 0
        assert status(k8s, "spot")["phase"] == "Pending"
        await wait_for(lambda n=n: [t for t, _ in events(k8s, "spot", "Preempted")] == ["Normal"] * n,
                       what="a Preempted Event per preemption")
    await fail(k8s, "spot", "Container main for pod rl/spot-trainer-0-gh56i failed with exit code 1 matching FailJob "
                            "rule at index 2")
    await wait_for(lambda: status(k8s, "spot")["phase"] == "Failed", what="a real failure still fails it")


async def _evicted_pod(k8s, job: str, reason: str) -> None:
    """A trainer pod as the kubelet or the eviction API leaves it: failed, with a DisruptionTarget condition."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{job}-trainer-0-x1", "namespace": NS,
        "labels": {"streamrl.io/job": job, "streamrl.io/role": "trainer"}},
        "spec": {"containers": [{"name": "main", "image": "streamrl:test"}]}}
    resp = await k8s.post(f"/api/v1/namespaces/{NS}/pods", json=pod)
    assert resp.status in (200, 201), await resp.text()
    resp = await k8s.patch(f"/api/v1/namespaces/{NS}/pods/{job}-trainer-0-x1/status", json={"status": {
        "phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": reason}]}})
    assert resp.status == 200, await resp.text()


async def test_a_kubelet_eviction_and_preemptions_past_their_limit_spend_the_budget(k8s, operator):
    """N7: a node-pressure eviction (an emptyDir over its sizeLimit, say) restarted for free
    would loop forever, holding the GPUs; so would endless preemptions."""
    body = sharded("evict", nodes=2)
    body["spec"]["trainer"].update(restartLimit=0, preemptionLimit=1)
    await create(k8s, body)
    await wait_for(lambda: status(k8s, "evict")["trainer"]["expectedPods"] == 2, what="status written")
    await _evicted_pod(k8s, "evict", "TerminationByKubelet")
    await fail(k8s, "evict", "Pod rl/evict-trainer-0-x1 has condition DisruptionTarget matching FailJob rule at "
                             "index 1")
    await wait_for(lambda: status(k8s, "evict")["phase"] == "Failed", what="the eviction counted")
    assert "evicted by the kubelet (TerminationByKubelet" in status(k8s, "evict")["message"]

    body = sharded("spot2", nodes=2)
    body["spec"]["trainer"].update(restartLimit=0, preemptionLimit=1)
    await create(k8s, body)
    await wait_for(lambda: status(k8s, "spot2")["trainer"]["expectedPods"] == 2, what="status written")
    message = ("Container main for pod rl/spot2-trainer-0-ab12c failed with exit code 75 matching FailJob rule at "
               "index 0")
    uid = trainer_job(k8s, "spot2")["metadata"]["uid"]
    await fail(k8s, "spot2", message)
    await wait_for(lambda: trainer_job(k8s, "spot2")["metadata"]["uid"] != uid and
                   not trainer_job(k8s, "spot2").get("status"), what="the first preemption restarted for free")
    await fail(k8s, "spot2", message)
    await wait_for(lambda: status(k8s, "spot2")["phase"] == "Failed", what="the second one counted")
    assert "after 1 preemption(s) already (trainer.preemptionLimit 1)" in status(k8s, "spot2")["message"]


async def test_suspend_lets_the_trainer_save_and_resume_keeps_the_budget(k8s, operator):
    await create(k8s, with_volume(sharded("pause", nodes=2), size="10Gi"))
    await wait_for(lambda: status(k8s, "pause")["trainer"]["expectedPods"] == 2, what="status written")
    grace = trainer_job(k8s, "pause")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == 300  # time to finish the step and save after SIGTERM
    spec = plain(get(k8s, RLJOB, "pause")["spec"])
    spec["suspend"] = True
    await k8s.patch(f"{JOBS}/pause", json={"spec": spec})
    await wait_for(lambda: trainer_job(k8s, "pause")["spec"]["suspend"] is True, what="the Job suspended")
    await wait_for(lambda: status(k8s, "pause")["phase"] == "Suspended", what="phase Suspended")
    # The Job controller deletes the pods: SIGTERM, the ranks save, torch.distributed.run exits 1;
    # the pod failure policy fails the suspended Job.
    uid = trainer_job(k8s, "pause")["metadata"]["uid"]
    await fail(k8s, "pause", "Container main for pod rl/pause-trainer-1-k1l2m failed with exit code 1 matching "
                             "FailJob rule at index 2")
    await wait_for(lambda: trainer_job(k8s, "pause")["metadata"]["uid"] != uid and
                   not trainer_job(k8s, "pause").get("status"), what="the group created again")
    assert trainer_job(k8s, "pause")["spec"]["suspend"] is True  # still suspended: no pod starts
    await wait_for(lambda: status(k8s, "pause")["trainer"]["preemptions"] == 1, what="counted as a preemption")
    assert (status(k8s, "pause")["phase"], status(k8s, "pause")["trainer"]["restarts"]) == ("Suspended", 0)
    # Resume: the same Job is unsuspended, its pods mount the same claim and find the checkpoint.
    recreated = trainer_job(k8s, "pause")["metadata"]["uid"]
    spec["suspend"] = False
    await k8s.patch(f"{JOBS}/pause", json={"spec": spec})
    await wait_for(lambda: trainer_job(k8s, "pause")["spec"]["suspend"] is False, what="the Job resumed")
    assert trainer_job(k8s, "pause")["metadata"]["uid"] == recreated
    assert run_directory(k8s, "pause")[0] == {"name": "out", "persistentVolumeClaim": {"claimName":
                                                                                       "pause-checkpoints"}}
    await wait_for(lambda: status(k8s, "pause")["phase"] == "Pending", what="phase Pending again")


async def test_status_after_a_simulated_restart_shows_the_resume_and_one_resumed_event(k8s, operator):
    body = trainer_status(TrainerPhase.RUNNING, iteration=9, num_iterations=20).model_copy(update={
        "incarnation": 1, "resumed_from": 7,
        "last_checkpoint": CheckpointInfo(iteration=5, time_unix=1_800_000_000.0, path=f"{OUT}/checkpoints/iter-00005"),
    })
    admin = AdminServer(ServiceMetrics("trainer").registry, lambda: body, lambda: True).start()
    try:
        operator.trainer_status = _fetch_from(admin)
        await create(k8s, with_volume(example("again"), size="5Gi"))
        await wait_for(lambda: status(k8s, "again")["phase"] == "Running", what="phase Running")
        trainer = status(k8s, "again")["trainer"]
        assert (trainer["incarnation"], trainer["resumedFrom"], trainer["iteration"]) == (1, 7, 9)
        assert plain(trainer["lastCheckpoint"]) == {"iteration": 5, "time": "2027-01-15T08:00:00Z"}
        await wait_for(lambda: events(k8s, "again", "Resumed"), what="the Resumed Event")
        # Four refreshes later (every 0.5 s here), still one Event for this start.
        await asyncio.sleep(2.0)
        assert events(k8s, "again", "Resumed") == [
            ("Normal", "the trainer resumed at iteration 7 from its checkpoint (start 2 of run tiny-0)")]
        # The operator forgets (a restart of its own): the status remembers, no second Event.
        operator.resumed.clear()
        await asyncio.sleep(1.5)
        assert len(events(k8s, "again", "Resumed")) == 1
        # The trainer restarts again: a new start, a new Event (the admin server serves `body`).
        body = body.model_copy(update={"incarnation": 2, "resumed_from": 12})
        await wait_for(lambda: len(events(k8s, "again", "Resumed")) == 2, what="the second Resumed Event")
        assert ("Normal", "the trainer resumed at iteration 12 from its checkpoint (start 3 of run tiny-0)") in \
            events(k8s, "again", "Resumed")
        assert status(k8s, "again")["trainer"]["resumedFrom"] == 12
    finally:
        admin.stop()


async def test_the_hub_cache_of_a_job_without_a_checkpoint_volume_is_a_claim_that_outlives_its_pods(k8s, operator):
    """N7: the download lived in the pod's emptyDir, so an eviction threw it away and the
    restarted group downloaded the model again (and filled the node's disk again)."""
    body = sharded("hub", nodes=2)
    body["spec"]["model"] = {"source": "hf", "hf": {"repo": "org/m", "cacheSize": "140Gi"}}
    await create(k8s, body)
    await wait_for(lambda: "hub-hf-cache" in claims(k8s), what="the hub cache's claim")
    await wait_for(lambda: trainer_job(k8s, "hub"), what="the trainer Job")
    cache = claim(k8s, "hub-hf-cache")
    assert plain(cache["spec"]) == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "140Gi"}}}
    [owner] = cache["metadata"]["ownerReferences"]
    assert owner["uid"] == get(k8s, RLJOB, "hub")["metadata"]["uid"]  # a cache: it goes with the job
    pod = trainer_job(k8s, "hub")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "hf-cache"]
    assert plain(volume["persistentVolumeClaim"]) == {"claimName": "hub-hf-cache"}
    # An eviction restarts the group; the new pods mount the same claim, made once.
    uid = trainer_job(k8s, "hub")["metadata"]["uid"]
    created = cache["metadata"]["uid"]
    await fail(k8s, "hub", "Pod rl/hub-trainer-1-de34f has condition DisruptionTarget matching FailJob rule at index 1")
    await wait_for(lambda: trainer_job(k8s, "hub")["metadata"]["uid"] != uid, what="the group restarted")
    assert claim(k8s, "hub-hf-cache")["metadata"]["uid"] == created
    pod = trainer_job(k8s, "hub")["spec"]["template"]["spec"]
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == "hub-hf-cache" for v in pod["volumes"])
    assert (await k8s.delete(f"{JOBS}/hub")).status == 200
    await wait_for(lambda: "hub-hf-cache" not in claims(k8s), what="the cache deleted with the job")
