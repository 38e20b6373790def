"""Server-side apply takes over the fields an older operator wrote.

Operators before server-side apply wrote children with merge patches and no `fieldManager`,
so the API server recorded those fields under the user agent's name, `python-httpx`, with
operation `Update`. An apply by `streamrl-operator` then shares every field it applies with
the same value and never removes one it stops applying while `python-httpx` still owns it: a
field dropped from the spec after the upgrade would stay on the children for good.

Before its first apply to such a child, the operator moves the legacy manager's fields into
its own `Apply` entry and drops the legacy entry, as client-go's `csaupgrade` does for
kubectl's client-side apply (k8s.io/client-go/util/csaupgrade: `UpgradeManagedFields`, the
union of the field sets, then a JSON patch of `/metadata/managedFields` with the object's
`resourceVersion` as the precondition). The apply that follows then owns, and prunes, all of it.
"""

from __future__ import annotations

from streamrl.operator.kube import FIELD_MANAGER

LEGACY_MANAGERS = frozenset({"python-httpx"})
"""Field managers of earlier operators: the user agent of their httpx client, which the API
server records when a request names no fieldManager."""


def _legacy(entry: dict, legacy: frozenset[str]) -> bool:
    return entry.get("manager") in legacy and entry.get("operation") == "Update" and not entry.get("subresource")


def _union(a: dict, b: dict) -> dict:
    """The union of two FieldsV1 trees."""
    out = dict(a)
    for key, sub in b.items():
        out[key] = _union(out.get(key) or {}, sub or {})
    return out


def upgraded_managed_fields(managed: list[dict], manager: str = FIELD_MANAGER,
                            legacy: frozenset[str] = LEGACY_MANAGERS) -> list[dict] | None:
    """`managed` (an object's managedFields) with the legacy managers' Update entries merged
    into `manager`'s Apply entry (created when it has none); None when there is nothing of
    theirs. Entries of other managers, and the legacy managers' status entries, are kept."""
    olds = [e for e in managed if _legacy(e, legacy)]
    if not olds:
        return None
    kept = [dict(e) for e in managed if not _legacy(e, legacy)]
    mine = next((e for e in kept if e.get("manager") == manager and e.get("operation") == "Apply"
                 and not e.get("subresource")), None)
    if mine is None:
        mine = {"manager": manager, "operation": "Apply", "apiVersion": olds[-1].get("apiVersion", ""),
                "fieldsType": "FieldsV1", "fieldsV1": {}}
        if olds[-1].get("time"):
            mine["time"] = olds[-1]["time"]
        kept.append(mine)
    fields = mine.get("fieldsV1") or {}
    for old in olds:
        fields = _union(fields, old.get("fieldsV1") or {})
    mine["fieldsV1"] = fields
    return kept


def migration_patch(current: dict, manager: str = FIELD_MANAGER) -> list[dict] | None:
    """The JSON patch that hands `current`'s legacy-owned fields to `manager` (None: nothing to
    do). The resourceVersion it writes back is a precondition: 409 when the object changed."""
    meta = current.get("metadata") or {}
    upgraded = upgraded_managed_fields(meta.get("managedFields") or [], manager)
    if upgraded is None:
        return None
    return [{"op": "replace", "path": "/metadata/managedFields", "value": upgraded},
            {"op": "replace", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}]
