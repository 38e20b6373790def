"""The RL job is one gang under Kueue, on the real operator against the emulator with Kueue
installed (kueue.py): while the trainer Job is not admitted (queued, evicted) no generator
pool or ranker holds a GPU, and the status says why it waits; a Job Kueue took without the
RLJob asking (a namespace's `default` LocalQueue, manageJobsWithoutQueueName) is Kueue's:
the operator never un-suspends it."""

from __future__ import annotations

import pytest

from tests.integration.operator.conftest import wait_for
from tests.integration.operator.kueue import Kueue
from tests.integration.operator.test_lifecycle import exists, settle, status, suspend_then_resume
from tests.integration.operator.test_operator import DEPLOYMENTS, JOBS_RES, NS, create, example, get

QUEUE = "kueue.x-k8s.io/queue-name"


@pytest.fixture
def kueue(k8s) -> Kueue:
    return Kueue(k8s)


def ganged(name: str, queue: str | None = None) -> dict:
    body = example(name)
    if queue:
        body["metadata"]["labels"] = {QUEUE: queue}
    body["spec"]["generators"]["dispatch"] = {"policy": "skewness-aware"}  # a ranker as well
    return body


def replicas(k8s, job: str) -> tuple[int, int]:
    """(the generator pool's replicas, the ranker's)."""
    return (get(k8s, DEPLOYMENTS, f"{job}-gen-default")["spec"]["replicas"],
            get(k8s, DEPLOYMENTS, f"{job}-ranker")["spec"]["replicas"])


def ever_scaled(k8s, job: str) -> bool:
    """Whether any version of the pool's or the ranker's Deployment asked for a pod."""
    return any(version["spec"]["replicas"] for role in ("gen-default", "ranker")
               for version in k8s.objects[DEPLOYMENTS, NS, f"{job}-{role}", :])


def queued(k8s, job: str) -> dict:
    return {c["type"]: c for c in status(k8s, job)["conditions"]}["Queued"]


async def test_pools_and_ranker_hold_no_gpu_until_kueue_admits_the_trainer_and_after_it_evicts_it(
        k8s, kueue, operator):
    await kueue.local_queue(NS, "team-a")
    await create(k8s, ganged("gang", "team-a"))
    await wait_for(lambda: exists(k8s, DEPLOYMENTS, "gang-ranker"), what="children")
    await settle(operator)
    assert not ever_scaled(k8s, "gang") and get(k8s, JOBS_RES, "gang-trainer")["spec"]["suspend"] is True
    waiting = ("queued in LocalQueue rl/team-a: waiting for quota (couldn't assign flavors to pod set main: "
               "insufficient unused quota for nvidia.com/gpu in flavor default-flavor, 1 more needed)")
    await wait_for(lambda: status(k8s, "gang")["message"] == waiting, what="Queued, as its Workload says")
    assert (queued(k8s, "gang")["status"], queued(k8s, "gang")["reason"]) == ("True", "Pending")
    assert status(k8s, "gang")["phase"] == "Pending"
    assert status(k8s, "gang")["generators"]["replicas"] == 0 and status(k8s, "gang")["trainer"]["expectedPods"] == 0

    await kueue.admit(NS, "gang-trainer")
    await wait_for(lambda: replicas(k8s, "gang") == (1, 1), what="pools and ranker scaled up on admission")
    await wait_for(lambda: queued(k8s, "gang")["status"] == "False", what="not Queued")
    assert queued(k8s, "gang")["reason"] == "Admitted"

    await kueue.evict(NS, "gang-trainer")  # preempted: Kueue suspends the Job
    await wait_for(lambda: replicas(k8s, "gang") == (0, 0), what="pools and ranker back to 0 on eviction")
    await wait_for(lambda: queued(k8s, "gang")["reason"] == "Evicted", what="Queued: Evicted")
    assert status(k8s, "gang")["message"].startswith("queued in LocalQueue rl/team-a: evicted (Preempted: ")

    await kueue.admit(NS, "gang-trainer")
    await wait_for(lambda: replicas(k8s, "gang") == (1, 1), what="admitted again")
    assert kueue.unsuspended == []  # the operator never un-suspended the Job itself


async def test_without_kueue_a_queued_job_says_it_waits_for_admission_and_holds_no_gpu(k8s, operator):
    await create(k8s, ganged("alone", "gpu-queue"))
    await wait_for(lambda: exists(k8s, DEPLOYMENTS, "alone-ranker"), what="children")
    await settle(operator)
    assert not ever_scaled(k8s, "alone") and get(k8s, JOBS_RES, "alone-trainer")["spec"]["suspend"] is True
    assert status(k8s, "alone")["message"] == (
        "queued in LocalQueue rl/gpu-queue: waiting for Kueue to admit the trainer Job (it has no Workload yet: "
        "is Kueue running, for batch/Job?)")
    assert (queued(k8s, "alone")["status"], queued(k8s, "alone")["reason"]) == ("True", "NoWorkload")


async def test_a_job_kueue_took_through_the_default_local_queue_is_never_unsuspended_by_the_operator(
        k8s, kueue, operator):
    await kueue.local_queue(NS)  # "default": Kueue labels every Job created in the namespace
    await create(k8s, ganged("adopted"))  # no queue label on the RLJob
    await wait_for(lambda: exists(k8s, JOBS_RES, "adopted-trainer"), what="trainer Job")
    assert get(k8s, JOBS_RES, "adopted-trainer")["metadata"]["labels"][QUEUE] == "default"
    await settle(operator)
    assert kueue.unsuspended == [] and get(k8s, JOBS_RES, "adopted-trainer")["spec"]["suspend"] is True
    assert not ever_scaled(k8s, "adopted")  # created at 0 in the very first round
    assert status(k8s, "adopted")["message"].startswith("queued in LocalQueue rl/default: waiting for quota")

    await suspend_then_resume(k8s, operator, "adopted")
    await settle(operator)
    assert kueue.unsuspended == [] and replicas(k8s, "adopted") == (0, 0)
    await kueue.admit(NS, "adopted-trainer")
    await wait_for(lambda: replicas(k8s, "adopted") == (1, 1), what="admitted")


async def test_a_job_kueue_manages_without_a_queue_name_is_never_unsuspended_by_the_operator(k8s, operator):
    kueue = Kueue(k8s, manage_jobs_without_queue_name=True)
    await create(k8s, ganged("managed"))
    await wait_for(lambda: exists(k8s, JOBS_RES, "managed-trainer"), what="trainer Job")
    await settle(operator)
    assert kueue.unsuspended == [] and not ever_scaled(k8s, "managed")
    assert (queued(k8s, "managed")["status"], queued(k8s, "managed")["reason"]) == ("True", "Inadmissible")
    assert status(k8s, "managed")["message"] == "queued by Kueue: inadmissible (LocalQueue  doesn't exist)"
