"""The trainer as a group of pods, on the real operator against an emulated API server that
refuses a Job's template changes as the API server does: an Indexed Job with its headless
Service and rank 0's Service; its pods counted in the status; a failed group restarted whole
within the budget, then Failed; a new spec replacing the group."""

from __future__ import annotations

from tests.integration.operator.conftest import wait_for
from tests.integration.operator.test_operator import (
    CONFIGMAPS,
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

TRAINER = f"/apis/batch/v1/namespaces/{NS}/jobs"


def sharded(name: str, nodes: int = 3, per_node: int = 2) -> dict:
    body = example(name)
    body["spec"]["trainer"] = {**body["spec"].get("trainer", {}), "nodes": nodes, "processesPerNode": per_node}
    return body


def trainer_job(k8s, job: str) -> dict:
    return get(k8s, JOBS_RES, f"{job}-trainer")


def status(k8s, job: str) -> dict:
    return get(k8s, RLJOB, job)["status"]


async def fail(k8s, job: str, message: str) -> None:
    """What the Job controller writes when the pod failure policy fails the Job."""
    resp = await k8s.patch(f"{TRAINER}/{job}-trainer/status", json={"status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": message}]}})
    assert resp.status == 200, await resp.text()


async def test_a_three_node_trainer_is_an_indexed_job_and_its_ready_pods_are_counted(k8s, operator):
    await create(k8s, sharded("big"))
    await wait_for(lambda: status(k8s, "big")["trainer"]["expectedPods"] == 3, what="expected pods in status")
    spec = trainer_job(k8s, "big")["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert get(k8s, SERVICES, "big-trainer-ranks")["spec"]["clusterIP"] == "None"
    assert get(k8s, SERVICES, "big-trainer")["spec"]["selector"]["batch.kubernetes.io/job-completion-index"] == "0"
    resp = await k8s.patch(f"{TRAINER}/big-trainer/status", json={"status": {"ready": 2, "active": 3}})
    assert resp.status == 200
    await wait_for(lambda: status(k8s, "big")["trainer"]["readyPods"] == 2, what="ready pods counted")
    ready = {c["type"]: c for c in status(k8s, "big")["conditions"]}["Ready"]
    assert "2/3 trainer pods ready" in ready["message"]


async def test_a_failed_group_is_restarted_whole_within_the_budget_then_the_job_fails(k8s, operator):
    await create(k8s, sharded("flaky"))
    await wait_for(lambda: status(k8s, "flaky")["trainer"]["expectedPods"] == 3, what="status written")
    budget = operator.settings.trainer_backoff_limit
    assert budget == 2
    for attempt in range(1, budget + 1):
        uid = trainer_job(k8s, "flaky")["metadata"]["uid"]
        await fail(k8s, "flaky", f"pod flaky-trainer-2 exited with code {attempt}")
        await wait_for(lambda old=uid: trainer_job(k8s, "flaky")["metadata"]["uid"] != old and
                       not trainer_job(k8s, "flaky").get("status"), what=f"the group recreated (restart {attempt})")
        recreated = trainer_job(k8s, "flaky")
        assert recreated["metadata"]["annotations"]["streamrl.io/group-restarts"] == str(attempt)
        assert recreated["spec"]["completions"] == 3  # every rank again, never half a group
        await wait_for(lambda n=attempt: status(k8s, "flaky")["trainer"]["restarts"] == n, what="restarts counted")
    uid = trainer_job(k8s, "flaky")["metadata"]["uid"]
    await fail(k8s, "flaky", "pod flaky-trainer-0 exited with code 1")
    await wait_for(lambda: status(k8s, "flaky")["phase"] == "Failed", what="phase Failed with no restart left")
    assert status(k8s, "flaky")["message"] == (
        "the trainer group failed after 2 restart(s) (budget 2): pod flaky-trainer-0 exited with code 1; "
        "generators and ranker scaled to 0 (to train again, create the RLJob anew)")
    assert trainer_job(k8s, "flaky")["metadata"]["uid"] == uid  # kept, for its pods' logs


async def test_a_new_spec_replaces_the_group_that_the_api_server_would_not_patch(k8s, operator):
    await create(k8s, sharded("grow"))
    await wait_for(lambda: status(k8s, "grow")["trainer"]["expectedPods"] == 3, what="status written")
    old = plain(trainer_job(k8s, "grow"))
    patched = {"spec": {"template": {"spec": {"subdomain": "elsewhere"}}}}
    refused = await k8s.patch(f"{TRAINER}/grow-trainer", json=patched)
    assert refused.status == 422 and "field is immutable" in await refused.text()
    spec = plain(get(k8s, RLJOB, "grow")["spec"])
    spec["trainer"]["nodes"] = 2
    resp = await k8s.patch(f"{JOBS}/grow", json={"spec": spec})
    assert resp.status == 200
    await wait_for(lambda: trainer_job(k8s, "grow")["spec"]["completions"] == 2, what="the group replaced")
    new = trainer_job(k8s, "grow")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    command = new["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--nnodes") + 1] == "2"
    await wait_for(lambda: status(k8s, "grow")["trainer"]["expectedPods"] == 2, what="status follows")
    # Suspend is what a Job may change: patched in place, not replaced.
    spec["suspend"] = True
    await k8s.patch(f"{JOBS}/grow", json={"spec": spec})
    await wait_for(lambda: trainer_job(k8s, "grow")["spec"]["suspend"] is True, what="suspended in place")
    assert trainer_job(k8s, "grow")["metadata"]["uid"] == new["metadata"]["uid"]


async def test_an_edit_of_what_the_trainer_reads_only_at_start_keeps_the_running_group(k8s, operator):
    """N5: restartLimit is the operator's, minGenerators and checkpoint.everyIterations are read
    when the trainer starts: none replaces a running group (the ConfigMap carries them for its
    next start)."""
    await create(k8s, sharded("keep", nodes=2, per_node=1))
    await wait_for(lambda: status(k8s, "keep")["trainer"]["expectedPods"] == 2, what="status written")
    before = trainer_job(k8s, "keep")["metadata"]["uid"]
    spec = plain(get(k8s, RLJOB, "keep")["spec"])
    spec["trainer"].update(restartLimit=9, minGenerators=1)
    spec["checkpoint"] = {**spec.get("checkpoint", {}), "everyIterations": 3}
    resp = await k8s.patch(f"{JOBS}/keep", json={"spec": spec})
    assert resp.status == 200
    generation = get(k8s, RLJOB, "keep")["metadata"]["generation"]
    await wait_for(lambda: status(k8s, "keep")["observedGeneration"] == generation, what="the edit reconciled")
    await wait_for(lambda: "everyIterations: 3" in get(k8s, CONFIGMAPS, "keep-spec")["data"]["job.yaml"],
                   what="the ConfigMap carries the new values")
    assert trainer_job(k8s, "keep")["metadata"]["uid"] == before


async def test_a_trainer_that_exits_with_a_job_error_fails_the_job_at_once_with_budget_left(k8s, operator):
    """Exit 78 (ExitCode.JOB_ERROR): the job's reward function raised, or its checkpoints are
    another job's; every restart would repeat it, so none is spent."""
    await create(k8s, sharded("badreward", nodes=1))
    await wait_for(lambda: status(k8s, "badreward")["trainer"]["expectedPods"] == 1, what="status written")
    assert operator.settings.trainer_backoff_limit == 2
    uid = trainer_job(k8s, "badreward")["metadata"]["uid"]
    await fail(k8s, "badreward", "Container main for pod rl/badreward-trainer-0-ab12c failed with exit code 78 "
                                 "matching FailJob rule at index 2")
    await wait_for(lambda: status(k8s, "badreward")["phase"] == "Failed", what="phase Failed without a restart")
    assert status(k8s, "badreward")["trainer"]["restarts"] == 0
    assert status(k8s, "badreward")["message"].startswith(
        "the trainer failed with exit code 78: the job's own code or files failed in a way every restart repeats "
        "(see the trainer's log); not restarted: Container main for pod rl/badreward-trainer-0-ab12c failed")
    assert trainer_job(k8s, "badreward")["metadata"]["uid"] == uid  # kept, for its pod's log
