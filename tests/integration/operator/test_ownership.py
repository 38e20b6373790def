"""What the operator takes as a job's and what it leaves alone, under the chart's RBAC in both
modes: an object of a child's name that is someone else's is neither adopted, overwritten nor
deleted (the status says AlreadyExists); the token Secret is written without reading any
Secret, and never deleted by name."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.operator import fieldmanagers
from tests.integration.operator.conftest import wait_for
from tests.integration.operator.test_operator import (
    CONFIGMAPS,
    DEPLOYMENTS,
    JOBS,
    JOBS_RES,
    NS,
    RLJOB,
    create,
    example,
    get,
    plain,
)

pytestmark = pytest.mark.parametrize("watch_namespaces", [(), (NS,)], ids=["cluster-wide", "watch-rl"])
SECRETS = "v1/secrets"
ROUNDS = 4
"""Reconcile rounds a test waits for what must not happen."""


def exists(k8s, resource: str, name: str) -> bool:
    try:
        return not k8s.objects[resource, NS, name].deleted
    except KeyError:
        return False


def condition(k8s, job: str, kind: str) -> dict:
    return {c["type"]: c for c in get(k8s, RLJOB, job)["status"]["conditions"]}[kind]


async def rounds(operator, n: int = ROUNDS) -> None:
    await asyncio.sleep(n * operator.settings.status_interval_s)


async def post(k8s, path: str, body: dict) -> None:
    resp = await k8s.post(path, json=body)
    assert resp.status in (200, 201), await resp.text()


def operator_requests(k8s, method: str, fragment: str) -> list[str]:
    """Paths of the operator's own requests (they carry its token) with `fragment` in them."""
    return [r.url.path for r in k8s if getattr(r.method, "value", r.method).upper() == method
            and any(k.lower() == "authorization" for k in r.headers) and fragment in r.url.path]


async def test_a_job_naming_its_own_token_file_runs_and_a_secret_of_that_name_is_left_alone(
        k8s, operator, watch_namespaces):
    # Review N2: prune deleted "<job>-token" by name, which RBAC refuses (the job went Invalid
    # for good) and which, allowed, deleted whatever Secret had that name.
    theirs = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "byo-token", "namespace": NS},
              "data": {"token": "dGhlaXJz"}}
    await post(k8s, f"/api/v1/namespaces/{NS}/secrets", theirs)
    body = example("byo")
    body["spec"]["security"] = {"tokenFile": "/etc/byo/token"}
    await create(k8s, body)
    await wait_for(lambda: get(k8s, RLJOB, "byo")["status"]["phase"] == "Pending", what="phase Pending")
    await rounds(operator)
    assert get(k8s, RLJOB, "byo")["status"]["phase"] == "Pending", get(k8s, RLJOB, "byo")["status"]["message"]
    secret = get(k8s, SECRETS, "byo-token")
    assert not secret.deleted and secret["data"] == {"token": "dGhlaXJz"}
    assert "ownerReferences" not in secret["metadata"]
    assert not operator_requests(k8s, "DELETE", "/secrets/")


async def test_a_job_that_comes_to_name_its_own_token_file_keeps_running_and_its_minted_token_goes_with_it(
        k8s, operator, watch_namespaces):
    await create(k8s, example("turn"))
    await wait_for(lambda: exists(k8s, SECRETS, "turn-token"), what="minted token")
    spec = plain(get(k8s, RLJOB, "turn")["spec"])
    spec["security"] = {"tokenFile": "/etc/turn/token"}
    assert (await k8s.patch(f"{JOBS}/turn", json={"spec": spec})).status == 200
    await wait_for(lambda: "/etc/turn/token" in get(k8s, CONFIGMAPS, "turn-spec")["data"]["job.yaml"],
                   what="the spec names its own token")
    await rounds(operator)
    assert get(k8s, RLJOB, "turn")["status"]["phase"] == "Pending", get(k8s, RLJOB, "turn")["status"]["message"]
    # The minted Secret is no longer mounted; the garbage collector takes it with the job.
    assert exists(k8s, SECRETS, "turn-token")
    assert (await k8s.delete(f"{JOBS}/turn")).status == 200
    await wait_for(lambda: not exists(k8s, SECRETS, "turn-token"), what="token collected with its job")


async def test_the_token_secret_is_applied_and_repaired_without_reading_any_secret(k8s, operator, watch_namespaces):
    # Review N12: the operator read Secrets by name (cluster-wide: any Secret of the cluster);
    # the chart grants no `get` on them where jobs live any more.
    await create(k8s, example("blind"))
    await wait_for(lambda: exists(k8s, SECRETS, "blind-token"), what="minted token")
    token = get(k8s, SECRETS, "blind-token")["data"]["token"]
    assert (await k8s.delete(f"/api/v1/namespaces/{NS}/secrets/blind-token")).status == 200
    await wait_for(lambda: exists(k8s, SECRETS, "blind-token"), what="token written again")
    assert get(k8s, SECRETS, "blind-token")["data"]["token"] == token
    assert not [p for p in operator_requests(k8s, "GET", "/secrets/") if f"/namespaces/{NS}/" in p]
    assert get(k8s, RLJOB, "blind")["status"]["phase"] == "Pending"


async def test_an_ownerless_object_of_a_childs_name_is_adopted_only_with_the_jobs_labels(
        k8s, operator, watch_namespaces):
    # Review N17: an object with no controller was adopted: overwritten, then garbage-collected
    # with the job.
    stray = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stray-spec", "namespace": NS},
             "data": {"theirs": "1"}}
    await post(k8s, f"/api/v1/namespaces/{NS}/configmaps", stray)
    await create(k8s, example("stray"))
    await wait_for(lambda: get(k8s, RLJOB, "stray")["status"]["phase"] == "Invalid", what="Invalid")
    assert condition(k8s, "stray", "Failed")["reason"] == "AlreadyExists"
    assert get(k8s, RLJOB, "stray")["status"]["message"] == (
        "ConfigMap stray-spec exists and is not this job's (it has no controller and not this job's labels "
        "app.kubernetes.io/managed-by=streamrl-operator, streamrl.io/job=stray): not overwritten; delete or rename it")
    assert get(k8s, CONFIGMAPS, "stray-spec")["data"] == {"theirs": "1"}
    assert (await k8s.delete(f"{JOBS}/stray")).status == 200
    await wait_for(lambda: get(k8s, RLJOB, "stray").deleted, what="job deleted")
    assert exists(k8s, CONFIGMAPS, "stray-spec")  # not the job's: not collected with it
    # An object of the job's left without an owner (kubectl delete --cascade=orphan) is taken back.
    orphan = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "orphan-spec", "namespace": NS,
        "labels": {"app.kubernetes.io/managed-by": "streamrl-operator", "streamrl.io/job": "orphan"}}, "data": {}}
    await post(k8s, f"/api/v1/namespaces/{NS}/configmaps", orphan)
    await create(k8s, example("orphan"))
    await wait_for(lambda: get(k8s, CONFIGMAPS, "orphan-spec")["metadata"].get("ownerReferences"), what="adopted")
    await wait_for(lambda: get(k8s, RLJOB, "orphan")["status"]["phase"] == "Pending", what="phase Pending")


async def test_a_trainer_job_of_that_name_that_is_someone_elses_is_not_replaced(k8s, operator, watch_namespaces):
    theirs = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "busy-trainer", "namespace": NS},
              "spec": {"template": {"spec": {"restartPolicy": "Never",
                                             "containers": [{"name": "main", "image": "theirs"}]}}}}
    await post(k8s, f"/apis/batch/v1/namespaces/{NS}/jobs", theirs)
    await create(k8s, example("busy"))
    await wait_for(lambda: get(k8s, RLJOB, "busy")["status"]["phase"] == "Invalid", what="Invalid")
    assert condition(k8s, "busy", "Failed")["reason"] == "AlreadyExists"
    assert "Job busy-trainer exists and is not this job's" in get(k8s, RLJOB, "busy")["status"]["message"]
    await rounds(operator)
    job = get(k8s, JOBS_RES, "busy-trainer")
    assert not job.deleted and job["spec"]["template"]["spec"]["containers"][0]["image"] == "theirs"


async def test_fields_an_operator_before_server_side_apply_wrote_are_taken_over_and_pruned(
        k8s, operator, watch_namespaces):
    # Review N26: children an earlier operator wrote by merge patch (no fieldManager: the server
    # records its user agent, python-httpx) co-own every field; a field later dropped from the
    # spec stayed, shared with a manager that no longer exists.
    body = example("legacy")
    body["spec"]["generators"]["pools"][0]["placement"] = {"nodeSelector": {"pool": "a"}}
    await create(k8s, body)
    await wait_for(lambda: exists(k8s, DEPLOYMENTS, "legacy-gen-default"), what="generator Deployment")
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/legacy-gen-default"
    deployment = plain(get(k8s, DEPLOYMENTS, "legacy-gen-default"))
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "a"}
    # The Deployment as the earlier operator left it: it created it, so python-httpx owns all of it.
    before_upgrade = [{"manager": "python-httpx", "operation": "Update", "apiVersion": "apps/v1",
                       "fieldsType": "FieldsV1",
                       "fieldsV1": fieldmanagers.to_fields_v1(fieldmanagers.field_paths(deployment))}]
    resp = await k8s.patch(path, json=[{"op": "replace", "path": "/metadata/managedFields", "value": before_upgrade}],
                           headers={"Content-Type": "application/json-patch+json"})
    assert resp.status == 200, await resp.text()
    spec = plain(get(k8s, RLJOB, "legacy")["spec"])
    spec["generators"]["pools"][0]["placement"] = {}
    assert (await k8s.patch(f"{JOBS}/legacy", json={"spec": spec})).status == 200

    def pruned() -> bool:
        return "nodeSelector" not in get(k8s, DEPLOYMENTS, "legacy-gen-default")["spec"]["template"]["spec"]

    await wait_for(pruned, what="the dropped nodeSelector removed")
    managers = {(e["manager"], e["operation"]) for e in get(k8s, DEPLOYMENTS, "legacy-gen-default")["metadata"][
        "managedFields"]}
    assert ("python-httpx", "Update") not in managers and ("streamrl-operator", "Apply") in managers
    # What the operator applies is its own alone now: its next apply leaves nothing to anyone else.
    owned = fieldmanagers.paths_of_entry(plain(get(k8s, DEPLOYMENTS, "legacy-gen-default")), "streamrl-operator",
                                         "Apply")
    assert ("f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"main"}', "f:image") in owned
