"""Field ownership (`metadata.managedFields`) as the API server keeps it, for the emulator.

Upstream: k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager (the managers, operations and
the user-agent default) over sigs.k8s.io/structured-merge-diff/v4 (field sets and the apply
merge). What is modelled, each rule as upstream has it:

- A field set is the set of leaf paths of an object (`f:<key>` per map key, `k:{"name":...}`
  per item of a list of named items, `.` for a map or an item itself, anything else a leaf), in
  the `FieldsV1` tree form of managedFields. `apiVersion`, `kind`, `status` (its own
  subresource) and the server's metadata (`name`, `uid`, `resourceVersion`...) are never owned.
- The manager is the request's `fieldManager`, else the user agent up to its first `/`
  (fieldmanager.go, `prefixFromUserAgent`): an httpx client without one is `python-httpx`.
- An Update (create, merge patch, JSON patch) gives its manager every field it set or changed
  and takes those fields from every other manager (updates never conflict); its entry has
  operation `Update`. A field removed by an update leaves every set.
- An Apply makes the manager's `Apply` entry exactly the fields of its configuration. A field
  the manager applied before and no longer applies is removed from the object **only when no
  other manager owns it** (the co-ownership that upgrades trip over: structured-merge-diff's
  `prune` keeps what others own). Forced, it takes the fields whose value it changes from the
  others; fields applied with the value already there stay shared.
- A request that writes `metadata.managedFields` itself replaces them (client-go's csaupgrade
  migrates that way, with the object's resourceVersion as a precondition).

Not modelled: atomic maps and other list keys than `name` (the emulator merges named lists
by name), the `time` of entries, ownership of status.
"""

from __future__ import annotations

import copy
import json

SERVER_METADATA = frozenset({"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                             "managedFields", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"})

Path = tuple[str, ...]


def manager_of(params, headers) -> str:
    """The request's field manager: `fieldManager`, else the user agent's product name."""
    manager = params.get("fieldManager")
    if manager:
        return manager
    agent = next((v for k, v in headers.items() if k.lower() == "user-agent"), "") or "unknown"
    return agent.split("/", 1)[0]


def _named(items) -> bool:
    return isinstance(items, list) and bool(items) and all(isinstance(x, dict) and "name" in x for x in items)


def _item_key(name: str) -> str:
    return "k:" + json.dumps({"name": name}, separators=(",", ":"))


def owned_part(obj: dict) -> dict:
    """What of `obj` can be owned: everything but apiVersion, kind, status and server metadata."""
    out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status", "metadata")}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in SERVER_METADATA}
    if meta:
        out["metadata"] = meta
    return out


def field_paths(obj: dict) -> set[Path]:
    """The leaf paths of `obj`'s ownable part."""
    out: set[Path] = set()

    def walk(node, prefix: Path) -> None:
        if isinstance(node, dict) and node:
            if prefix and not prefix[-1].startswith("k:"):
                out.add(prefix + (".",))  # the map itself (a list item's `.` is added below)
            for k, v in node.items():
                walk(v, prefix + (f"f:{k}",))
        elif _named(node):
            for item in node:
                here = prefix + (_item_key(item["name"]),)
                out.add(here + (".",))
                walk(item, here)
        else:
            out.add(prefix)

    walk(owned_part(obj), ())
    return out


def to_fields_v1(paths: set[Path]) -> dict:
    tree: dict = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(part, {})
    return tree


def from_fields_v1(tree: dict) -> set[Path]:
    out: set[Path] = set()

    def walk(node: dict, prefix: Path) -> None:
        if not node:
            out.add(prefix)
        for k, v in node.items():
            walk(v, prefix + (k,))

    walk(tree or {}, ())
    return {p for p in out if p}


def value_at(obj, path: Path):
    """The value at `path` (a leaf path), or KeyError."""
    node = owned_part(obj) if isinstance(obj, dict) and ("metadata" in obj or "apiVersion" in obj) else obj
    for part in path:
        if part == ".":
            return node
        if part.startswith("f:") and isinstance(node, dict):
            node = node[part[2:]]
        elif part.startswith("k:") and isinstance(node, list):
            name = json.loads(part[2:])["name"]
            node = next(x for x in node if isinstance(x, dict) and x.get("name") == name)
        else:
            raise KeyError(part)
    return node


def _get(obj, path: Path):
    try:
        return True, value_at(obj, path)
    except (KeyError, StopIteration):
        return False, None


def remove_paths(obj: dict, paths: set[Path]) -> dict:
    """`obj` without the fields at `paths`: leaves first, then a list item whose `.` is among
    them (whole), then a map whose `.` is among them once nothing is left in it."""
    out = copy.deepcopy(obj)
    for path in sorted(paths, key=lambda p: len(p) - (p[-1] == "."), reverse=True):  # the deepest first
        container = path[-1] == "."
        parent_path, last = (path[:-2], path[-2]) if container else (path[:-1], path[-1])
        node = out
        try:
            for part in parent_path:
                if part.startswith("f:"):
                    node = node[part[2:]]
                else:
                    name = json.loads(part[2:])["name"]
                    node = next(x for x in node if x.get("name") == name)
        except (KeyError, StopIteration, TypeError, AttributeError):
            continue
        if last.startswith("f:") and isinstance(node, dict):
            if not container or node.get(last[2:]) in ({}, None):
                node.pop(last[2:], None)
        elif last.startswith("k:") and isinstance(node, list):
            name = json.loads(last[2:])["name"]
            node[:] = [x for x in node if not (isinstance(x, dict) and x.get("name") == name)]
    return out


def entries(obj: dict | None) -> list[dict]:
    return copy.deepcopy(((obj or {}).get("metadata") or {}).get("managedFields") or [])


def _set(managed: list[dict], manager: str, operation: str, api_version: str, paths: set[Path]) -> None:
    entry = next((e for e in managed if e.get("manager") == manager and e.get("operation") == operation
                  and not e.get("subresource")), None)
    if entry is None:
        entry = {"manager": manager, "operation": operation, "apiVersion": api_version, "fieldsType": "FieldsV1"}
        managed.append(entry)
    entry["fieldsV1"] = to_fields_v1(paths)


def _take(managed: list[dict], paths: set[Path], keep: dict) -> list[dict]:
    """Every entry but `keep` without `paths`; entries left owning nothing go."""
    out = []
    for e in managed:
        if e is not keep and not e.get("subresource"):
            left = from_fields_v1(e.get("fieldsV1") or {}) - paths
            if not left:
                continue
            e["fieldsV1"] = to_fields_v1(left)
        out.append(e)
    return out


def after_update(current: dict | None, new: dict, manager: str) -> list[dict]:
    """managedFields once `manager` wrote `new` over `current` by create or patch."""
    managed = entries(current)
    if current is not None and (new.get("metadata") or {}).get("managedFields") != managed:
        return entries(new)  # the request set managedFields itself
    before, after = (field_paths(current) if current else set()), field_paths(new)
    changed = {p for p in after if _get(current or {}, p) != _get(new, p)}
    gone = before - after
    mine = next((e for e in managed if e.get("manager") == manager and e.get("operation") == "Update"
                 and not e.get("subresource")), None)
    owned = from_fields_v1(mine.get("fieldsV1") or {}) if mine else set()
    managed = _take(managed, changed | gone, keep=mine)
    if changed or owned:
        if mine is not None and mine not in managed:
            managed.append(mine)
        _set(managed, manager, "Update", new.get("apiVersion", ""), (owned | changed) - gone)
    return [e for e in managed if e.get("fieldsV1")]


def applied(current: dict | None, config: dict, manager: str, force: bool) -> tuple[set[Path], list[dict]]:
    """What an apply of `config` by `manager` removes from `current` (the fields it stopped
    applying that no one else owns) and the managedFields after it (forced: with the fields
    whose value it changes taken from the others)."""
    managed = entries(current)
    mine = next((e for e in managed if e.get("manager") == manager and e.get("operation") == "Apply"
                 and not e.get("subresource")), None)
    before = from_fields_v1(mine.get("fieldsV1") or {}) if mine else set()
    now = field_paths(config)
    changed = {p for p in now if _get(current or {}, p) != _get(config, p)} if force else set()
    managed = _take(managed, changed, keep=mine)
    others = set().union(*(from_fields_v1(e.get("fieldsV1") or {}) for e in managed
                           if e is not mine and not e.get("subresource")))
    if mine is not None and mine not in managed:
        managed.append(mine)
    _set(managed, manager, "Apply", config.get("apiVersion", ""), now)
    return before - now - others, managed


def paths_of_entry(obj: dict, manager: str, operation: str) -> set[Path]:
    """The fields `manager` owns by `operation` in `obj` (tests read ownership through this)."""
    return set().union(*(from_fields_v1(e.get("fieldsV1") or {}) for e in entries(obj)
                         if e.get("manager") == manager and e.get("operation") == operation))
