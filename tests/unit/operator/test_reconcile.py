"""Whose an existing object is (reconcile.foreign): the job's own, another controller's, or
someone's that merely has the name."""

from __future__ import annotations

import pytest

from streamrl.operator.names import labels, object_meta
from streamrl.operator.reconcile import foreign

OWNER = {"apiVersion": "streamrl.io/v1alpha1", "kind": "RLJob", "name": "j", "uid": "u1", "controller": True}
DESIRED = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": object_meta("j-spec", "rl", labels("j", "spec"), OWNER)}


def _current(**meta) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "j-spec", "namespace": "rl", **meta}}


@pytest.mark.parametrize(("current", "why"), [
    (_current(ownerReferences=[OWNER]), None),
    (_current(labels=labels("j", "spec")), None),  # the job's, orphaned (kubectl delete --cascade=orphan)
    (_current(ownerReferences=[{**OWNER, "kind": "Deployment", "name": "x", "uid": "u2"}]),
     "its controller is Deployment x"),
    (_current(), "it has no controller and not this job's labels app.kubernetes.io/managed-by=streamrl-operator, "
                 "streamrl.io/job=j"),
    (_current(labels={"streamrl.io/job": "j"}), "it has no controller and not this job's labels "
                                                "app.kubernetes.io/managed-by=streamrl-operator, streamrl.io/job=j"),
    (_current(labels=labels("k", "spec")), "it has no controller and not this job's labels "
                                           "app.kubernetes.io/managed-by=streamrl-operator, streamrl.io/job=j"),
    # An owner that is not a controller (someone's own reference) does not make it the job's.
    (_current(ownerReferences=[{**OWNER, "controller": False, "uid": "u3"}]), "it has no controller and not this "
     "job's labels app.kubernetes.io/managed-by=streamrl-operator, streamrl.io/job=j"),
])
def test_an_existing_object_is_the_jobs_only_with_its_controller_or_its_labels(current, why):
    assert foreign(DESIRED, current) == why
