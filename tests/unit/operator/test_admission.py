"""Who holds the trainer Job's `suspend`, and why it waits, read from the live Job and Kueue's
Workload: Kueue by the Job's label (the RLJob's, or its LocalQueue defaulting's) or by a
Workload; the operator only by its own mark; anyone else's suspension waits for them."""

from __future__ import annotations

import pytest

from streamrl.operator.admission import needs_workload, read_admission
from streamrl.spec import parse_job

QUEUE = "kueue.x-k8s.io/queue-name"


def rljob(labels: dict | None = None, suspend: bool = False):
    return parse_job({"metadata": {"name": "j", **({"labels": labels} if labels else {})},
                      "spec": {"model": {"source": "builtin-tiny"}, "suspend": suspend}})


def job(suspend: bool, labels: dict | None = None, annotations: dict | None = None, **spec) -> dict:
    return {"metadata": {"name": "j-trainer", "uid": "u1", "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"suspend": suspend, **spec}}


def workload(*conditions: tuple[str, str, str, str], queue: str = "team-a") -> dict:
    return {"metadata": {"name": "job-j-trainer-abcde"}, "spec": {"queueName": queue},
            "status": {"conditions": [{"type": t, "status": s, "reason": r, "message": m}
                                      for t, s, r, m in conditions]}}


PENDING = ("QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set main: insufficient unused quota")


@pytest.mark.parametrize("rl, live, wl, want", [
    # no Kueue anywhere: nothing waits
    (rljob(), None, None, (False, False, "NotQueued", "")),
    (rljob(), job(False), None, (False, False, "NotQueued", "")),
    # the operator's own suspension (spec.suspend): its own to lift, nothing waits for admission
    (rljob(suspend=True), job(True, annotations={"streamrl.io/suspended-by": "spec.suspend"}), None,
     (False, False, "NotQueued", "")),
    # the RLJob's label, before its Job exists: held for Kueue
    (rljob({QUEUE: "team-a"}), None, None,
     (True, True, "Pending", "queued in LocalQueue ns/team-a: the trainer Job is being created for Kueue to admit")),
    # labelled by Kueue's LocalQueue defaulting, no label on the RLJob
    (rljob(), job(True, {QUEUE: "default"}), workload(PENDING, queue="default"),
     (True, True, "Pending", "queued in LocalQueue ns/default: waiting for quota (couldn't assign flavors to pod "
                             "set main: insufficient unused quota)")),
    # no label at all (manageJobsWithoutQueueName): the Workload says it is Kueue's
    (rljob(), job(True), workload(("QuotaReserved", "False", "Inadmissible", "LocalQueue  doesn't exist"), queue=""),
     (True, True, "Inadmissible", "queued by Kueue: inadmissible (LocalQueue  doesn't exist)")),
    # labelled, but Kueue made no Workload (not installed, not running for batch/Job)
    (rljob({QUEUE: "q"}), job(True, {QUEUE: "q"}), None,
     (True, True, "NoWorkload", "queued in LocalQueue ns/q: waiting for Kueue to admit the trainer Job (it has no "
                                "Workload yet: is Kueue running, for batch/Job?)")),
    # suspended by someone else, no Kueue: waits for them
    (rljob(), job(True), None, (False, True, "SuspendedByOther", "the trainer Job was suspended by another "
                                                                 "controller (a queue?): waiting for it to be "
                                                                 "resumed")),
    # quota reserved, admission checks pending
    (rljob({QUEUE: "q"}), job(True, {QUEUE: "q"}),
     workload(("QuotaReserved", "True", "QuotaReserved", ""), ("Admitted", "False", "UnsatisfiedChecks", "")),
     (True, True, "UnsatisfiedChecks", "queued in LocalQueue ns/q: waiting for admission checks")),
    # evicted (preempted): waits to be admitted again
    (rljob({QUEUE: "q"}), job(True, {QUEUE: "q"}),
     workload(("Evicted", "True", "Preempted", "Preempted to accommodate a workload"), PENDING),
     (True, True, "Evicted", "queued in LocalQueue ns/q: evicted (Preempted: Preempted to accommodate a workload), "
                             "waiting to be admitted again")),
    # admitted, Kueue about to un-suspend it: the other roles may start with it
    (rljob({QUEUE: "q"}), job(True, {QUEUE: "q"}),
     workload(("QuotaReserved", "True", "QuotaReserved", ""), ("Admitted", "True", "Admitted", "")),
     (True, False, "Admitted", "queued in LocalQueue ns/q: admitted, the trainer Job is being started")),
    # admitted and un-suspended by Kueue
    (rljob({QUEUE: "q"}), job(False, {QUEUE: "q"}), None,
     (True, False, "Admitted", "the trainer Job was admitted by Kueue")),
    # MultiKueue would run the trainer in another cluster: never here
    (rljob({QUEUE: "q"}), job(True, {QUEUE: "q"}, managedBy="kueue.x-k8s.io/multikueue"), None,
     (True, True, "MultiKueue", None)),
])
def test_admission_is_read_from_the_live_job_and_its_workload(rl, live, wl, want):
    got = read_admission(rl, "ns", live, wl)
    assert (got.kueue, got.waiting, got.reason) == want[:3]
    if want[3] is not None:
        assert got.message == want[3]


def test_a_job_just_created_for_kueue_waits_for_its_workload_without_blaming_kueue():
    got = read_admission(rljob(), "ns", job(True, {QUEUE: "default"}), None, created=True)
    assert (got.kueue, got.waiting, got.reason) == (True, True, "Pending")
    assert got.message == "queued in LocalQueue ns/default: the trainer Job is being created for Kueue to admit"


def test_the_workload_is_looked_for_only_when_a_suspension_is_not_the_operators_or_it_is_about_to_suspend():
    ours = {"streamrl.io/suspended-by": "spec.suspend"}
    assert not needs_workload(rljob(), None)
    assert not needs_workload(rljob(), job(False))  # running, and staying so
    assert needs_workload(rljob(), job(True))  # someone suspended it: Kueue?
    assert not needs_workload(rljob(suspend=True), job(True, annotations=ours))
    assert needs_workload(rljob(suspend=True), job(False))  # about to suspend a Job Kueue may own
