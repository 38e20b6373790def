"""What a real cluster does to a job over its life, on the real operator against the emulator
(which enforces the API server's rules): a finished job releases every GPU and never trains
again; a multi-node trainer succeeds when rank 0 did; children are applied the Kubernetes
way (removed keys go, drift is repaired, nothing is written when nothing changed); a
config-only change rolls the pods; /scale works from the first reconcile; Kueue owns the
trainer's `suspend`; the API server's refusals and the pods' troubles reach the status."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.operator.conftest import wait_for
from tests.integration.operator.test_autoscaling import events
from tests.integration.operator.test_operator import (
    CONFIGMAPS,
    DEPLOYMENTS,
    JOBS,
    JOBS_RES,
    NS,
    RLJOB,
    SERVICES,
    create,
    example,
    get,
    plain,
)

TRAINERS = f"/apis/batch/v1/namespaces/{NS}/jobs"
TICKS = 4
"""Status intervals (0.5 s in these tests) to wait for something that must not happen."""


@pytest.fixture
def kopf_settings(kopf_settings):
    kopf_settings.posting.enabled = True  # Events on restarts and terminal phases are part of what is checked
    return kopf_settings


def status(k8s, job: str) -> dict:
    return get(k8s, RLJOB, job)["status"]


def exists(k8s, resource: str, name: str) -> bool:
    try:
        return not k8s.objects[resource, NS, name].deleted
    except KeyError:
        return False


async def settle(operator) -> None:
    await asyncio.sleep(TICKS * operator.settings.status_interval_s)


async def job_status(k8s, job: str, **status) -> None:
    """What the Job controller writes (through the status subresource)."""
    resp = await k8s.patch(f"{TRAINERS}/{job}-trainer/status", json={"status": status})
    assert resp.status == 200, await resp.text()


def ranked(name: str) -> dict:
    body = example(name)
    body["spec"]["generators"]["dispatch"] = {"policy": "skewness-aware"}
    body["spec"]["generators"]["pools"].append({"name": "extra", "replicas": 2})
    return body


async def suspend_then_resume(k8s, operator, job: str) -> None:
    """spec.suspend of a job Kueue queues: no trainer Job at all (Kueue would admit a suspended
    one), none created again while suspended; resumed, it is created again for Kueue to admit."""
    spec = plain(get(k8s, RLJOB, job)["spec"])
    spec["suspend"] = True
    assert (await k8s.patch(f"{JOBS}/{job}", json={"spec": spec})).status == 200
    await wait_for(lambda: not exists(k8s, JOBS_RES, f"{job}-trainer"), what="trainer Job deleted")
    await settle(operator)
    assert not exists(k8s, JOBS_RES, f"{job}-trainer")
    spec["suspend"] = False
    assert (await k8s.patch(f"{JOBS}/{job}", json={"spec": spec})).status == 200
    await wait_for(lambda: exists(k8s, JOBS_RES, f"{job}-trainer"), what="created again, for Kueue")


async def test_a_finished_job_releases_every_gpu_and_is_never_trained_again(k8s, operator):
    await create(k8s, ranked("done"))
    await wait_for(lambda: exists(k8s, JOBS_RES, "done-trainer") and exists(k8s, DEPLOYMENTS, "done-gen-extra"),
                   what="children created")
    assert [get(k8s, DEPLOYMENTS, d)["spec"]["replicas"] for d in ("done-gen-default", "done-gen-extra",
                                                                      "done-ranker")] == [1, 2, 1]
    await job_status(k8s, "done", conditions=[{"type": "SuccessCriteriaMet", "status": "True"},
                                              {"type": "Complete", "status": "True"}], succeeded=1)
    await wait_for(lambda: status(k8s, "done")["phase"] == "Succeeded", what="Succeeded")
    # KubeRay's shutdownAfterJobFinishes: no GPU stays allocated to a generator that would crash-loop.
    await wait_for(lambda: [get(k8s, DEPLOYMENTS, d)["spec"]["replicas"] for d in (
        "done-gen-default", "done-gen-extra", "done-ranker")] == [0, 0, 0], what="pools and ranker at 0")
    await wait_for(lambda: status(k8s, "done")["generators"]["replicas"] == 0, what="status says 0 replicas")
    assert status(k8s, "done")["completionTime"]
    await wait_for(lambda: [e for e in events(k8s, "done") if e[1] == "Succeeded"], what="Succeeded Event")
    # A TTL controller or a user deletes the finished Job: it is not created again.
    assert (await k8s.delete(f"{TRAINERS}/done-trainer")).status == 200
    await settle(operator)
    assert not exists(k8s, JOBS_RES, "done-trainer")
    assert status(k8s, "done")["phase"] == "Succeeded"
    assert status(k8s, "done")["message"].startswith("the trainer finished every iteration")
    # A spec change (kubectl scale, an edit) does not start it again either.
    spec = plain(get(k8s, RLJOB, "done")["spec"])
    spec["generators"]["pools"][0]["replicas"] = 4
    assert (await k8s.patch(f"{JOBS}/done", json={"spec": spec})).status == 200
    await settle(operator)
    assert not exists(k8s, JOBS_RES, "done-trainer") and get(k8s, DEPLOYMENTS, "done-gen-default")["spec"][
        "replicas"] == 0
    # N15: a finished job costs the API server nothing between its rare resyncs.
    mark = len(k8s._requests)
    await settle(operator)
    assert [r.url.path for r in k8s._requests[mark:] if "/done" in r.url.path] == []


async def test_a_multi_node_trainer_succeeds_when_rank_0_did_not_when_another_index_did(k8s, operator):
    body = example("multi")
    body["spec"]["trainer"] = {"nodes": 2}
    await create(k8s, body)
    await wait_for(lambda: exists(k8s, JOBS_RES, "multi-trainer"), what="trainer Job")
    # Index 1 exits 0 while rank 0 still gathers and saves the final model.
    await job_status(k8s, "multi", succeeded=1, completedIndexes="1", active=1)
    await settle(operator)
    assert status(k8s, "multi")["phase"] == "Pending"
    assert get(k8s, DEPLOYMENTS, "multi-gen-default")["spec"]["replicas"] == 1
    await job_status(k8s, "multi", succeeded=2, completedIndexes="0-1", active=0)
    await wait_for(lambda: status(k8s, "multi")["phase"] == "Succeeded", what="Succeeded once index 0 is done")


async def test_a_field_removed_from_a_pools_placement_disappears_from_its_deployment(k8s, operator):
    body = example("place")
    body["spec"]["generators"]["pools"][0]["placement"] = {
        "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "template": {"metadata": {"annotations": {"team": "rl"}}}}
    await create(k8s, body)
    await wait_for(lambda: exists(k8s, DEPLOYMENTS, "place-gen-default"), what="pool")
    pod = get(k8s, DEPLOYMENTS, "place-gen-default")["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    spec = plain(get(k8s, RLJOB, "place")["spec"])
    spec["generators"]["pools"][0]["placement"] = {"nodeSelector": {"node.kubernetes.io/instance-type": "g5.2xlarge"}}
    assert (await k8s.patch(f"{JOBS}/place", json={"spec": spec})).status == 200
    await wait_for(lambda: get(k8s, DEPLOYMENTS, "place-gen-default")["spec"]["template"]["spec"].get(
        "nodeSelector") == {"node.kubernetes.io/instance-type": "g5.2xlarge"}, what="selector replaced, not merged")
    pod = plain(get(k8s, DEPLOYMENTS, "place-gen-default")["spec"]["template"])
    assert "tolerations" not in pod["spec"] and "team" not in pod["metadata"].get("annotations", {})


async def test_nothing_is_written_when_nothing_changed(k8s, operator):
    body = example("quiet")
    body["spec"]["generators"]["pools"][0]["placement"] = {"gpus": 8, "resources": {"requests": {"cpu": 0.5}}}
    body["spec"]["trainer"] = {"placement": {"gpus": 1, "resources": {"limits": {"memory": "8Gi"}}}}
    await create(k8s, body)
    await wait_for(lambda: status(k8s, "quiet")["phase"] == "Pending" and
                   get(k8s, RLJOB, "quiet")["spec"]["generators"].get("replicas") == 1, what="first reconcile")
    await settle(operator)
    mark = len(k8s._requests)
    k8s.writes.clear()
    await settle(operator)
    requests = [(r.method.value, r.url.path) for r in k8s._requests[mark:]]
    assert k8s.writes == []
    # Not even a no-op apply (the object is what was applied last), but for the token Secret: the
    # operator may not read Secrets, so it applies that one every round (changing nothing).
    written = [r for r in requests if r[0] in ("POST", "PUT", "PATCH", "DELETE") and "/events" not in r[1]]
    assert set(written) <= {("PATCH", f"/api/v1/namespaces/{NS}/secrets/quiet-token")}, written
    # N15: the children are not read either: a watch keeps them (drift is still repaired, below).
    reads = [path for method, path in requests if method == "GET" and "watch" not in path]
    children = [p for p in reads if any(f"/{kind}/quiet-" in p for kind in ("configmaps", "services", "deployments"))]
    assert children == [], children
    assert any(p.endswith("/jobs/quiet-trainer") for p in reads)  # the trainer Job is read each round


async def test_drift_in_any_child_is_repaired(k8s, operator):
    await create(k8s, example("drift"))
    await wait_for(lambda: exists(k8s, SERVICES, "drift-trainer") and exists(k8s, DEPLOYMENTS, "drift-gen-default"),
                   what="children")
    assert (await k8s.delete(f"/api/v1/namespaces/{NS}/services/drift-trainer")).status == 200
    containers = plain(get(k8s, DEPLOYMENTS, "drift-gen-default")["spec"]["template"]["spec"]["containers"])
    containers[0]["image"] = "someone/else:latest"
    resp = await k8s.patch(f"/apis/apps/v1/namespaces/{NS}/deployments/drift-gen-default",
                           json={"spec": {"template": {"spec": {"containers": containers}}}})
    assert resp.status == 200
    await wait_for(lambda: exists(k8s, SERVICES, "drift-trainer"), what="deleted Service re-created")
    await wait_for(lambda: get(k8s, DEPLOYMENTS, "drift-gen-default")["spec"]["template"]["spec"]["containers"][0][
        "image"] == "streamrl:test", what="edited image restored")


async def test_a_config_only_change_rolls_every_role(k8s, operator):
    await create(k8s, example("roll"))
    await wait_for(lambda: exists(k8s, JOBS_RES, "roll-trainer") and exists(k8s, DEPLOYMENTS, "roll-gen-default"),
                   what="children")

    def hash_of(resource: str, name: str) -> str:
        return get(k8s, resource, name)["spec"]["template"]["metadata"]["annotations"]["streamrl.io/config-hash"]

    before = hash_of(DEPLOYMENTS, "roll-gen-default"), get(k8s, JOBS_RES, "roll-trainer")["metadata"]["uid"]
    assert hash_of(JOBS_RES, "roll-trainer")
    spec = plain(get(k8s, RLJOB, "roll")["spec"])
    spec["algorithm"]["learningRate"] = 1e-4  # reaches the pods only through the ConfigMap
    assert (await k8s.patch(f"{JOBS}/roll", json={"spec": spec})).status == 200
    await wait_for(lambda: "learningRate: 0.0001" in get(k8s, CONFIGMAPS, "roll-spec")["data"]["job.yaml"],
                   what="ConfigMap updated")
    await wait_for(lambda: hash_of(DEPLOYMENTS, "roll-gen-default") != before[0], what="generators rolled")
    await wait_for(lambda: exists(k8s, JOBS_RES, "roll-trainer") and
                   get(k8s, JOBS_RES, "roll-trainer")["metadata"]["uid"] != before[1], what="trainer group replaced")


async def test_scale_works_from_the_first_reconcile_and_the_total_follows_the_pools(k8s, operator):
    body = example("scaled")
    body["spec"]["generators"]["pools"].append({"name": "b", "replicas": 2})
    await create(k8s, body)
    scale = f"{JOBS}/scaled/scale"
    await wait_for(lambda: get(k8s, RLJOB, "scaled")["spec"]["generators"].get("replicas") == 3,
                   what="spec.generators.replicas written")
    resp = await k8s.get(scale)
    assert resp.status == 200 and (await resp.json())["spec"]["replicas"] == 3  # what HPA and KEDA read first
    # A pool edited by hand: the total follows (nothing has written /scale yet).
    spec = plain(get(k8s, RLJOB, "scaled")["spec"])
    spec["generators"]["pools"][1]["replicas"] = 5
    assert (await k8s.patch(f"{JOBS}/scaled", json={"spec": spec})).status == 200
    await wait_for(lambda: get(k8s, RLJOB, "scaled")["spec"]["generators"]["replicas"] == 6, what="total followed")
    await wait_for(lambda: get(k8s, DEPLOYMENTS, "scaled-gen-b")["spec"]["replicas"] == 5, what="pool b at 5")
    # KEDA writes /scale: the total is its own now, spread over the pools in proportion.
    assert (await k8s.patch(scale, json={"spec": {"replicas": 12}})).status == 200
    await wait_for(lambda: (get(k8s, DEPLOYMENTS, "scaled-gen-default")["spec"]["replicas"],
                            get(k8s, DEPLOYMENTS, "scaled-gen-b")["spec"]["replicas"]) == (2, 10),
                   what="/scale spread over the pools")
    await settle(operator)
    assert get(k8s, RLJOB, "scaled")["spec"]["generators"]["replicas"] == 12  # left alone


async def test_kueue_owns_the_trainers_suspend(k8s, operator):
    body = example("queued")
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "gpu-queue"}
    await create(k8s, body)
    await wait_for(lambda: exists(k8s, DEPLOYMENTS, "queued-gen-default"), what="children")
    job = get(k8s, JOBS_RES, "queued-trainer")
    assert job["spec"]["suspend"] is True  # created suspended: Kueue admits the group as one workload
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert get(k8s, DEPLOYMENTS, "queued-gen-default")["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == \
        "gpu-queue"
    for admitted in (True, False, True):  # Kueue admits, preempts, admits again: the operator never undoes it
        resp = await k8s.patch(f"{TRAINERS}/queued-trainer", json={"spec": {"suspend": not admitted}})
        assert resp.status == 200
        await settle(operator)
        assert get(k8s, JOBS_RES, "queued-trainer")["spec"]["suspend"] is not admitted
        # the generators hold GPUs only while the trainer is admitted
        assert get(k8s, DEPLOYMENTS, "queued-gen-default")["spec"]["replicas"] == (1 if admitted else 0)
    # The user suspends the job: no trainer Job at all (Kueue would admit a suspended one);
    # resumed, it is created again, suspended, for Kueue to admit.
    await suspend_then_resume(k8s, operator, "queued")
    assert get(k8s, JOBS_RES, "queued-trainer")["spec"]["suspend"] is True


async def test_an_object_the_api_server_refuses_makes_the_job_invalid_with_its_message(k8s, operator):
    body = example("refused")
    body["spec"]["generators"]["pools"][0]["placement"] = {"template": {"metadata": {"labels": {"team": "a b"}}}}
    await create(k8s, body)
    await wait_for(lambda: status(k8s, "refused")["phase"] == "Invalid", what="Invalid")
    message = status(k8s, "refused")["message"]
    assert message.startswith("the API server refused an object of the job: ")
    assert "spec.template.metadata.labels[team]" in message and "a label value" in message
    failed = {c["type"]: c for c in status(k8s, "refused")["conditions"]}["Failed"]
    assert (failed["status"], failed["reason"]) == ("True", "Invalid")
    # A new spec brings a new attempt.
    spec = plain(get(k8s, RLJOB, "refused")["spec"])
    spec["generators"]["pools"][0]["placement"] = {"template": {"metadata": {"labels": {"team": "rl"}}}}
    assert (await k8s.patch(f"{JOBS}/refused", json={"spec": spec})).status == 200
    await wait_for(lambda: status(k8s, "refused")["phase"] == "Pending", what="Pending again")


async def test_a_pending_job_says_why_its_pods_do_not_run(k8s, operator):
    await create(k8s, example("stuck"))
    await wait_for(lambda: exists(k8s, DEPLOYMENTS, "stuck-gen-default"), what="children")
    # Pod Security admission refused the ReplicaSet's pods: no pod exists, an Event says why.
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "stuck.1", "namespace": NS},
             "involvedObject": {"kind": "ReplicaSet", "name": "stuck-gen-default-5d4f8", "namespace": NS},
             "reason": "FailedCreate", "type": "Warning",
             "message": 'pods "stuck-gen-default-5d4f8-x" is forbidden: violates PodSecurity "restricted:latest": '
                        'seccompProfile'}
    assert (await k8s.post(f"/api/v1/namespaces/{NS}/events", json=event)).status in (200, 201)
    await wait_for(lambda: status(k8s, "stuck")["message"].startswith("FailedCreate: ReplicaSet "
                                                                      "stuck-gen-default-5d4f8: pods"),
                   what="FailedCreate said")
    pods_ready = {c["type"]: c for c in status(k8s, "stuck")["conditions"]}["PodsReady"]
    assert (pods_ready["status"], pods_ready["reason"]) == ("False", "FailedCreate")
    assert (await k8s.delete(f"/api/v1/namespaces/{NS}/events/stuck.1")).status == 200
    # The trainer's pod cannot be placed; the generator's image cannot be pulled.
    labels = {"streamrl.io/job": "stuck", "streamrl.io/role": "trainer"}
    for name, pod_status in [
        ("stuck-trainer-0-abcde", {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu"}]}),
        ("stuck-gen-default-5d4f8-q", {"containerStatuses": [{"name": "main", "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": 'Back-off pulling image "streamrl:test"'}}}]}),
    ]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels},
               "spec": {"containers": [{"name": "main", "image": "streamrl:test"}]}}
        assert (await k8s.post(f"/api/v1/namespaces/{NS}/pods", json=pod)).status in (200, 201)
        resp = await k8s.patch(f"/api/v1/namespaces/{NS}/pods/{name}/status", json={"status": pod_status})
        assert resp.status == 200
    await wait_for(lambda: status(k8s, "stuck")["message"] == (
        "Unschedulable: pod stuck-trainer-0-abcde: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu "
        "(and 1 more problem(s))"), what="unschedulable said")
    pods_ready = {c["type"]: c for c in status(k8s, "stuck")["conditions"]}["PodsReady"]
    assert pods_ready["reason"] == "Unschedulable"


async def test_a_model_download_shows_its_progress_in_the_status(k8s, operator):
    body = example("hub")
    body["spec"]["model"] = {"source": "hf", "hf": {"repo": "Qwen/Qwen2.5-7B"}}
    await create(k8s, body)
    await wait_for(lambda: exists(k8s, JOBS_RES, "hub-trainer"), what="trainer Job")
    pod_name = "hub-trainer-0-abcde"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": pod_name, "namespace": NS,
                        "labels": {"streamrl.io/job": "hub", "streamrl.io/role": "trainer"}},
           "spec": {"initContainers": [{"name": "fetch", "image": "streamrl:test"}],
                    "containers": [{"name": "main", "image": "streamrl:test"}]}}
    assert (await k8s.post(f"/api/v1/namespaces/{NS}/pods", json=pod)).status in (200, 201)
    running = {"initContainerStatuses": [{"name": "fetch",
                                          "state": {"running": {"startedAt": "2026-12-05T08:00:00Z"}}}]}
    resp = await k8s.patch(f"/api/v1/namespaces/{NS}/pods/{pod_name}/status", json={"status": running})
    assert resp.status == 200
    head = (f"FetchingModel: pod {pod_name}: init container fetch is putting the model and task file (from the "
            "Hugging Face Hub) in place, since 2026-12-05T08:00:00Z")
    await wait_for(lambda: status(k8s, "hub")["message"] == head, what="the download said, before its first line")
    said = ["model.hf Qwen/Qwen2.5-7B@main: fetching 15.2 GB into the Hugging Face cache (once; later starts find it "
            "there)", "model.hf Qwen/Qwen2.5-7B@main: 1.2 GB of 15.2 GB (8%), 45.0 MB/s, about 5 min left"]
    k8s.pod_logs[NS, pod_name, "fetch"] = "\n".join(said[:1]) + "\n"
    await wait_for(lambda: status(k8s, "hub")["message"] == f"{head}; {said[0]}", what="the download's first line")
    k8s.pod_logs[NS, pod_name, "fetch"] = "\n".join(said) + "\n"
    await wait_for(lambda: status(k8s, "hub")["message"] == f"{head}; {said[1]}", what="the download's progress")
    assert status(k8s, "hub")["phase"] == "Pending"


async def test_a_restart_is_counted_once_even_when_the_operator_fails_between_counting_and_deleting(k8s, operator):
    body = example("once")
    body["spec"]["trainer"] = {"nodes": 2, "restartLimit": 3}
    await create(k8s, body)
    await wait_for(lambda: exists(k8s, JOBS_RES, "once-trainer"), what="trainer Job")
    uid = get(k8s, JOBS_RES, "once-trainer")["metadata"]["uid"]
    k8s.fail_once[("DELETE", f"{TRAINERS}/once-trainer")] = 500  # the server fails the group's deletion once
    await job_status(k8s, "once", conditions=[{"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
                                               "message": "pod once-trainer-1 exited with code 1"}])
    await wait_for(lambda: exists(k8s, JOBS_RES, "once-trainer") and
                   get(k8s, JOBS_RES, "once-trainer")["metadata"]["uid"] != uid, timeout=15, what="restarted")
    await settle(operator)
    assert status(k8s, "once")["trainer"]["restarts"] == 1
    assert get(k8s, JOBS_RES, "once-trainer")["metadata"]["annotations"]["streamrl.io/group-restarts"] == "1"
    # `kubectl describe rljob` shows the restart (the timer saw it: timers' loggers post no Event of their own)
    restarted = [e for e in events(k8s, "once") if e[1] == "GroupRestarted"]
    assert restarted and restarted[0][0] == "Warning" and "pod once-trainer-1 exited with code 1" in restarted[0][2]


async def test_an_object_of_the_same_name_that_is_someone_elses_is_not_overwritten(k8s, operator):
    other = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "taken-spec", "namespace": NS, "ownerReferences": [{
                 "apiVersion": "apps/v1", "kind": "Deployment", "name": "someone", "uid": "1234", "controller": True}]},
             "data": {"theirs": "1"}}
    assert (await k8s.post(f"/api/v1/namespaces/{NS}/configmaps", json=other)).status in (200, 201)
    await create(k8s, example("taken"))
    await wait_for(lambda: status(k8s, "taken")["phase"] == "Invalid", what="Invalid")
    assert status(k8s, "taken")["message"] == (
        "ConfigMap taken-spec exists and is not this job's (its controller is Deployment someone): not overwritten; "
        "delete or rename it")
    assert get(k8s, CONFIGMAPS, "taken-spec")["data"] == {"theirs": "1"}
