"""The managedFields migration of children an operator before server-side apply wrote."""

from __future__ import annotations

from streamrl.operator.fieldowners import migration_patch, upgraded_managed_fields

LEGACY = {"manager": "python-httpx", "operation": "Update", "apiVersion": "apps/v1", "time": "2026-01-01T00:00:00Z",
          "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {"f:spec": {
              "f:nodeSelector": {".": {}, "f:pool": {}}}}}}}
MINE = {"manager": "streamrl-operator", "operation": "Apply", "apiVersion": "apps/v1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {}}}}}}
KUBE_CONTROLLER = {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
                   "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:replicas": {}}}}


def test_the_legacy_fields_join_the_operators_apply_entry_and_the_legacy_entry_goes():
    out = upgraded_managed_fields([LEGACY, MINE, KUBE_CONTROLLER])
    assert [(e["manager"], e["operation"]) for e in out] == [("streamrl-operator", "Apply"),
                                                              ("kube-controller-manager", "Update")]
    assert out[0]["fieldsV1"] == {"f:spec": {"f:replicas": {}, "f:template": {"f:spec": {
        "f:containers": {}, "f:nodeSelector": {".": {}, "f:pool": {}}}}}}
    assert out[1] == KUBE_CONTROLLER
    assert MINE["fieldsV1"] == {"f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {}}}}}


def test_without_an_apply_entry_yet_the_legacy_entry_becomes_one():
    [entry] = upgraded_managed_fields([LEGACY])
    assert entry == {**LEGACY, "manager": "streamrl-operator", "operation": "Apply"}


def test_nothing_to_migrate_is_none_and_a_legacy_status_entry_is_no_reason():
    assert upgraded_managed_fields([MINE, KUBE_CONTROLLER]) is None
    assert upgraded_managed_fields([{**LEGACY, "subresource": "status"}]) is None
    assert migration_patch({"metadata": {"resourceVersion": "7", "managedFields": [MINE]}}) is None


def test_the_patch_replaces_managed_fields_with_the_resource_version_as_precondition():
    ops = migration_patch({"metadata": {"resourceVersion": "7", "managedFields": [LEGACY, MINE]}})
    assert [(o["op"], o["path"]) for o in ops] == [("replace", "/metadata/managedFields"),
                                                    ("replace", "/metadata/resourceVersion")]
    assert ops[1]["value"] == "7" and [e["manager"] for e in ops[0]["value"]] == ["streamrl-operator"]
