"""What the operator takes as a job's and what it leaves alone, under the chart's RBAC in both
modes: the token Secret is written without reading any Secret, and never deleted by name."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.operator.conftest import wait_for
from tests.integration.operator.test_operator import (
    CONFIGMAPS,
    JOBS,
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
