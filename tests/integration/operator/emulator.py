"""kmock (kopf's Kubernetes API emulator) made to behave as a real API server where the
difference hid operator bugs. kmock 0.8 stores bodies verbatim, merges every PATCH and
replays watches without resourceVersion semantics; this subclass adds, per request:

| the real server                                        | here                                          |
|--------------------------------------------------------|-----------------------------------------------|
| uid, namespace, resourceVersion, creationTimestamp     | stamped on create                             |
| `metadata.generation` +1 on every spec change          | same (create: 1)                              |
| a write that changes nothing writes nothing            | no new resourceVersion, no watch event        |
| object names: DNS-1123 subdomain; Services and         | the same rules, 422 naming the field          |
| Namespaces DNS-1035/1123 labels; label values <= 63    |                                               |
| status subresource: `/status` writes status only, the  | same, for RLJobs and the built-in kinds with  |
| main resource everything but status                    | a status                                      |
| server-side apply (apply-patch+yaml, fieldManager):    | the same, lists of named items merged by name |
| creates, drops what the manager stopped applying,      | (the real key of some lists is another field) |
| keeps others' fields                                   |                                               |
| `metadata.managedFields`: who owns each field; a field | the same (fieldmanagers.py): Update and Apply |
| one manager stops applying stays while another owns it | entries, user agent as the default manager    |
| quantities stored as canonical strings                 | ints and floats of resources become strings   |
| `metadata.resourceVersion` in a PATCH is a precondition| 409 when stale                                |
| RLJob `/scale` (GET and PATCH on specReplicasPath); GET| same                                          |
| fails while the field does not exist                   |                                               |
| a Job's template, completions, mode are immutable      | 422                                           |
| garbage collection of dependents (ownerReferences)     | at once when the owner goes                   |
| label selectors on list and watch                      | equality and existence terms                  |
| `pods/<pod>/log?container=&tailLines=`                 | what the test wrote in `pod_logs`             |
| controllers and webhooks a test installs               | `controllers`: Kueue (kueue.py)               |
| authentication by bearer token; RBAC (Roles,           | `users` (token -> user) and `authorizer`      |
| ClusterRoles, bindings) decides every request before   | (rbac.py, the chart's rules): 401, 403 with   |
| it is served; an apply that creates needs `create` too | the server's message; tokenless = the test    |

Still not modelled: defaulting of pod fields, CRD schema validation and CEL (checked offline,
`streamrl validate`; what the server checks when a CRD is created: tests/crd_admission.py),
admission (PSA, quota; webhooks but an installed controller's), aggregated ClusterRoles,
SelfSubjectAccessReviews (they answer from `denied`, not RBAC), the Job and Deployment
controllers (tests write their status), graceful deletion of pods. It reaches into kmock's
private methods: kmock is pinned (pyproject.toml)."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import re
import uuid
from collections import defaultdict
from decimal import Decimal

import aiohttp.web
import jsonpatch
import kmock

from streamrl.spec import API_VERSION
from tests.integration.operator import fieldmanagers, rbac

VERSION = "v1.33.2"
"""The Kubernetes version the emulator answers /version with (the rules above are 1.33's)."""
FIELD_MANAGER_REQUIRED = "fieldManager is required for apply requests"
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
WITH_STATUS = {("", "services"), ("", "persistentvolumeclaims"), ("apps", "deployments"), ("batch", "jobs"),
               ("streamrl.io", "rljobs"), ("streamrl.io", "rlclusters"), ("", "pods")}
"""Resources whose status is written through their /status subresource only."""
QUANTITY_PARENTS = ("requests", "limits")


def _invalid(kind: str, name: str, field: str, message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=422, reason="Invalid",
                                 message=f"{kind} {name!r} is invalid: {field}: Invalid value: {message}")


def _quantity(value) -> str:
    """A number as the API server stores a quantity (8 -> "8", 0.5 -> "500m")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    d = Decimal(str(value))
    return str(int(d)) if d == d.to_integral_value() else f"{int(d * 1000)}m"


def _normalise(node, parent: str = ""):
    """Quantities under resources.requests/limits as canonical strings."""
    if isinstance(node, dict):
        return {k: (_quantity(v) if parent in QUANTITY_PARENTS else _normalise(v, k)) for k, v in node.items()}
    if isinstance(node, list):
        return [_normalise(v, parent) for v in node]
    return node


def _named(items) -> bool:
    return isinstance(items, list) and all(isinstance(x, dict) and "name" in x for x in items)


def _apply_merge(current, applied):
    """`applied` over `current`: maps key by key, lists of named items by name, anything else replaced."""
    if isinstance(current, dict) and isinstance(applied, dict):
        out = dict(current)
        for k, v in applied.items():
            out[k] = _apply_merge(current[k], v) if k in current else copy.deepcopy(v)
        return out
    if _named(current) and _named(applied) and applied:
        mine = {x["name"]: x for x in current}
        out = [_apply_merge(mine[x["name"]], x) if x["name"] in mine else copy.deepcopy(x) for x in applied]
        return out + [copy.deepcopy(x) for x in current if x["name"] not in {a["name"] for a in applied}]
    return copy.deepcopy(applied)


def _selector_matches(selector: str, labels: dict) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class Emulator(kmock.KubernetesEmulator):
    _rv: int = 1000

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.applied: dict[tuple, dict[str, dict]] = defaultdict(dict)
        """Per object, per field manager: the configuration it last applied (server-side apply)."""
        self.writes: list[tuple[str, str]] = []
        """(method, path) of every request that changed a stored object."""
        self.denied: set[tuple[str, str, str | None]] = set()
        """(verb, resource, namespace or None for every namespace) SelfSubjectAccessReviews deny."""
        self.pod_logs: dict[tuple[str, str, str], str] = {}
        """(namespace, pod, container) -> what GET pods/<pod>/log answers (the tests write it)."""
        self.namespaces: dict[str, dict] = {}
        """name -> the Namespace GET /api/v1/namespaces/<name> answers (kmock reads that path as
        a list in the namespace; the tests write what the real server would hold)."""
        self.controllers: list = []
        """What a test installed (kueue.Kueue): each one's `mutate(resource, namespace, body)`
        runs on a create before it is stored, its `written(resource, namespace, name,
        created)` after each create or patch that succeeded."""
        self.fail_once: dict[tuple[str, str], int] = {}
        """(method, path) -> an HTTP status the next such request gets instead of being served
        (a server that fails between two of the operator's writes)."""
        self.authorizer: rbac.Authorizer | None = None
        """Set: every request with a bearer token is authorized by it (RBAC) before it is served."""
        self.users: dict[str, rbac.User] = {}
        """Bearer token -> the user it authenticates. A request without a token is the test's own
        (as cluster-admin: never checked)."""
        self.refused: list[str] = []
        """The message of every 401 and 403 answered."""

    def _next_rv(self) -> str:
        type(self)._rv += 1
        return str(self._rv)

    # ---- dispatch --------------------------------------------------------------------
    async def _handle(self, request):
        try:
            self._authorize(request)
        except kmock.KubernetesError as err:
            return await self._render_error(err)
        response = await self._serve(request)
        writes = (kmock.action.CREATE, kmock.action.UPDATE)
        if self.controllers and request.resource is not None and request.action in writes and response.status < 300:
            name = request.name or ((request.data or {}).get("metadata") or {}).get("name")
            for controller in self.controllers:
                await controller.written(request.resource, request.namespace, name,
                                         request.action == kmock.action.CREATE)
        return response

    async def _serve(self, request):
        failure = self.fail_once.pop((getattr(request.method, "value", request.method), request.url.path), None)
        if failure is not None:
            return await self._render_error(kmock.KubernetesError(status=failure, reason="InternalError",
                                                                  message="injected failure"))
        try:
            one = NAMESPACE_PATH.match(request.url.path)
            if one and getattr(request.method, "value", request.method) == "GET":
                if one[1] not in self.namespaces:
                    raise kmock.KubernetesError(status=404, reason="NotFound",
                                                message=f'namespaces "{one[1]}" not found')
                return aiohttp.web.json_response(self.namespaces[one[1]])
            if request.resource is not None and request.resource.plural == "selfsubjectaccessreviews":
                return self._access_review(request)
            if request.resource is not None:
                if request.subresource == "log" and request.resource.plural == "pods":
                    return self._pod_log(request)
                if request.subresource == "scale" and (request.resource.group, request.resource.plural) == \
                        ("streamrl.io", "rljobs"):
                    return await self._scale(request)
                if request.action == kmock.action.UPDATE and request.name is not None:
                    return await self._patch(request)
                if request.action == kmock.action.CREATE:
                    self._prepare_create(request)
                if request.action == kmock.action.DELETE and request.name is not None:
                    return await self._delete(request)
                if request.action in (kmock.action.LIST, kmock.action.WATCH) and request.params.get("labelSelector"):
                    return await self._selected(request)
        except (kmock.KubernetesError, jsonpatch.JsonPatchTestFailed) as err:
            return await self._render_error(err)
        response = await super()._handle(request)
        if request.action == kmock.action.CREATE and response.status < 300:
            self.writes.append(("POST", request.url.path))
        return response

    # ---- create ----------------------------------------------------------------------
    def _prepare_create(self, request) -> None:
        data = request.data
        if not isinstance(data, dict):
            return
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        for controller in self.controllers:  # mutating webhooks
            controller.mutate(request.resource, request.namespace, data)
        self._validate(request.resource, data)
        normalised = _normalise(data)
        data.clear()
        data.update(normalised)
        meta = data["metadata"]
        meta["managedFields"] = fieldmanagers.after_update(
            None, data, fieldmanagers.manager_of(request.params, request.headers))
        if request.namespace:
            meta.setdefault("namespace", request.namespace)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).isoformat())
        meta["resourceVersion"] = self._next_rv()

    def _validate(self, resource, obj: dict) -> None:
        """Names and label values as the API server checks them."""
        meta, kind = obj.get("metadata") or {}, obj.get("kind", resource.plural)
        name = meta.get("name") or ""
        if resource.plural in ("services", "namespaces"):
            rule, what = (DNS1035_LABEL, "a DNS-1035 label") if resource.plural == "services" else \
                (DNS1123_LABEL, "a DNS-1123 label")
            if len(name) > 63 or not rule.match(name):
                raise _invalid(kind, name, "metadata.name", f"{name!r}: must be {what}: lower case letters, digits "
                                                            "and '-', at most 63 characters"
                               + (", starting with a letter" if rule is DNS1035_LABEL else ""))
        elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
            raise _invalid(kind, name, "metadata.name", f"{name!r}: must be a DNS-1123 subdomain")
        for where, labels in self._label_sets(obj):
            for key, value in (labels or {}).items():
                if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
                    raise _invalid(kind, name, f"{where}[{key}]", f"{value!r}: a label value must be 63 characters "
                                                                  "or less, alphanumeric, '-', '_' or '.'")

    @staticmethod
    def _label_sets(obj: dict):
        yield "metadata.labels", (obj.get("metadata") or {}).get("labels")
        template = (obj.get("spec") or {}).get("template")
        if isinstance(template, dict):
            yield "spec.template.metadata.labels", (template.get("metadata") or {}).get("labels")

    # ---- patch (merge and server-side apply) -----------------------------------------
    async def _patch(self, request):
        key = (request.resource, request.namespace, request.name)
        content_type = request.headers.get("Content-Type", "")
        apply = content_type.startswith("application/apply-patch")
        async with self._lock:
            exists = key in self._objects and not self._objects[key].deleted
            if not exists and not apply:
                raise kmock.KubernetesError(status=404, reason="NotFound", message=f"{request.name!r} not found")
            if not exists:  # patch.go: a patch that creates is authorized for create as well
                self._authorize(request, verb="create")
            current = copy.deepcopy(self._objects[key].raw) if exists else None
            data = request.data
            if apply:
                new = self._applied_object(request, key, current)
            elif isinstance(data, list):  # JSON patch (kopf's finalizers, a managedFields migration)
                new = jsonpatch.apply_patch(current, data)
                self._precondition(request, current, (new.get("metadata") or {}).get("resourceVersion"))
            else:
                new = self._merge_patched(request, current, data)
            if not apply and request.subresource != "status":
                new.setdefault("metadata", {})["managedFields"] = fieldmanagers.after_update(
                    current, new, fieldmanagers.manager_of(request.params, request.headers))
            if current is not None:
                self._refuse_immutable(request, current, new)
                self._split_status(request, current, new)
            new = _normalise(new)
            if current is not None and new == current:
                return aiohttp.web.json_response(current)  # nothing changed: nothing written
            self._validate(request.resource, new)
            if current is None:
                meta = new.setdefault("metadata", {})
                meta.update(namespace=request.namespace, uid=str(uuid.uuid4()), generation=1,
                            creationTimestamp=datetime.datetime.now(datetime.UTC).isoformat())
            else:
                meta = new["metadata"]
                if new.get("spec") != current.get("spec"):
                    meta["generation"] = int(current["metadata"].get("generation") or 1) + 1
            meta["resourceVersion"] = self._next_rv()
            if current is None:
                self._objects[key] = new
                event = "ADDED"
            else:
                self._objects[key].patch(self._replacement(current, new))
                event = "MODIFIED"
            raw = self._objects[key].raw
            self.writes.append(("PATCH", request.url.path))
            await self._buses[request.resource].put({"type": event, "object": raw})
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                await self._remove(key)  # the last finalizer gone: deleted, and its dependents collected
        return aiohttp.web.json_response(raw, status=201 if current is None else 200)

    def _applied_object(self, request, key, current: dict | None) -> dict:
        manager = request.params.get("fieldManager")
        if not manager:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=FIELD_MANAGER_REQUIRED)
        applied = copy.deepcopy(request.data)
        applied.get("metadata", {}).pop("resourceVersion", None)
        applied.get("metadata", {}).pop("managedFields", None)
        force = request.params.get("force") == "true"
        if current is not None and not force:
            conflicts = self._conflicts(key, manager, current, applied)
            if conflicts:
                raise kmock.KubernetesError(status=409, reason="Conflict", message="Apply failed with conflicts: "
                                                                                   + ", ".join(conflicts))
        removed, managed = fieldmanagers.applied(current, _normalise(applied), manager, force)
        new = applied if current is None else _apply_merge(fieldmanagers.remove_paths(current, removed), applied)
        new.setdefault("metadata", {})["managedFields"] = managed
        self.applied[key][manager] = applied
        return new

    def _conflicts(self, key, manager: str, current: dict, applied: dict) -> list[str]:
        """Top-level spec fields another manager applied with a different value."""
        out = []
        for other, config in self.applied[key].items():
            if other == manager:
                continue
            for field, value in (applied.get("spec") or {}).items():
                if field in (config.get("spec") or {}) and (current.get("spec") or {}).get(field) != value:
                    out.append(f'conflict with "{other}": .spec.{field}')
        return out

    def _merge_patched(self, request, current: dict, patch: dict) -> dict:
        self._precondition(request, current, (patch.get("metadata") or {}).get("resourceVersion"))
        return _merge(current, patch)

    @staticmethod
    def _precondition(request, current: dict, wanted: str | None) -> None:
        """A resourceVersion the write carries must be the stored one (409 otherwise)."""
        if wanted is not None and wanted != current["metadata"].get("resourceVersion"):
            raise kmock.KubernetesError(status=409, reason="Conflict", message=(
                f"Operation cannot be fulfilled on {request.resource.plural} {request.name!r}: the object has "
                "been modified; please apply your changes to the latest version and try again"))

    @staticmethod
    def _split_status(request, current: dict, new: dict) -> None:
        """A /status write changes the status alone; any other write everything but the status."""
        if (request.resource.group, request.resource.plural) not in WITH_STATUS:
            return
        if request.subresource == "status":
            status = new.get("status")
            new.clear()
            new.update(copy.deepcopy(current))
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        elif "status" in current or "status" in new:
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)

    @staticmethod
    def _replacement(current: dict, new: dict) -> dict:
        """The merge patch kmock's store needs to turn `current` into `new` (None removes)."""
        def diff(old, now):
            out = {k: None for k in old if k not in now}
            for k, v in now.items():
                if isinstance(v, dict) and isinstance(old.get(k), dict):
                    inner = diff(old[k], v)
                    if inner:
                        out[k] = inner
                elif old.get(k) != v or k not in old:
                    out[k] = v
            return out
        return diff(current, new)

    @staticmethod
    def _refuse_immutable(request, current: dict, new: dict) -> None:
        """As the API server does: a Job's pod template, completions and completion mode never
        change (suspend and parallelism may)."""
        if (request.resource.group, request.resource.plural) != ("batch", "jobs"):
            return
        for field in ("template", "completions", "completionMode"):
            if (new.get("spec") or {}).get(field) != (current.get("spec") or {}).get(field):
                raise kmock.KubernetesError(status=422, reason="Invalid",
                                            message=f"Job.batch {request.name!r} is invalid: spec.{field}: "
                                                    "field is immutable")

    # ---- delete, with the garbage collector ------------------------------------------
    async def _delete(self, request):
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesError(status=404, reason="NotFound", message=f"{request.name!r} not found")
            obj = copy.deepcopy(self._objects[key].raw)
            meta = obj["metadata"]
            if meta.get("finalizers"):
                if not meta.get("deletionTimestamp"):
                    self._objects[key].patch({"metadata": {
                        "deletionTimestamp": datetime.datetime.now(datetime.UTC).isoformat(),
                        "resourceVersion": self._next_rv()}})
                    self.writes.append(("DELETE", request.url.path))
                    await self._buses[request.resource].put({"type": "MODIFIED", "object": self._objects[key].raw})
                return aiohttp.web.json_response(self._objects[key].raw)
            await self._remove(key)
            self.writes.append(("DELETE", request.url.path))
        return aiohttp.web.json_response(obj)

    async def _remove(self, key) -> None:
        """Delete an object and, as the garbage collector does, every object it owns."""
        raw = self._objects[key].raw
        uid = raw["metadata"].get("uid")
        self._objects[key].delete()
        self.applied.pop(key, None)
        await self._buses[key[0]].put({"type": "DELETED", "object": raw})
        for other, obj in list(self._objects.items()):
            if obj.deleted:
                continue
            owners = obj.raw.get("metadata", {}).get("ownerReferences") or []
            if uid and any(o.get("uid") == uid for o in owners):
                await self._remove(other)

    # ---- /scale ----------------------------------------------------------------------
    async def _scale(self, request):
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesError(status=404, reason="NotFound", message=f"{request.name!r} not found")
            obj = self._objects[key].raw
        replicas = ((obj.get("spec") or {}).get("generators") or {}).get("replicas")
        if request.action == kmock.action.FETCH:
            if replicas is None:
                raise kmock.KubernetesError(status=500, reason="InternalError", message=(
                    'the spec replicas field ".spec.generators.replicas" does not exist'))
            status = obj.get("status") or {}
            return aiohttp.web.json_response({
                "apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": request.name, "namespace": request.namespace,
                             "resourceVersion": obj["metadata"]["resourceVersion"]},
                "spec": {"replicas": replicas},
                "status": {"replicas": (status.get("generators") or {}).get("replicas", 0),
                           "selector": (status.get("generators") or {}).get("labelSelector", "")}})
        patched = request.data.get("spec", {}).get("replicas")
        async with self._lock:
            current = copy.deepcopy(self._objects[key].raw)
            new = copy.deepcopy(current)
            new.setdefault("spec", {}).setdefault("generators", {})["replicas"] = patched
            new["metadata"]["generation"] = int(current["metadata"].get("generation") or 1) + 1
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._objects[key].patch(self._replacement(current, new))
            self.writes.append(("PATCH", request.url.path))
            await self._buses[request.resource].put({"type": "MODIFIED", "object": self._objects[key].raw})
        return aiohttp.web.json_response({"apiVersion": "autoscaling/v1", "kind": "Scale",
                                          "spec": {"replicas": patched}})

    # ---- pods/log ----------------------------------------------------------------------
    def _pod_log(self, request):
        """A container's log, its last tailLines lines; 404 for a pod or container without one."""
        text = self.pod_logs.get((request.namespace, request.name, request.params.get("container", "")))
        if text is None:
            raise kmock.KubernetesError(status=404, reason="NotFound", message=f"pods {request.name!r} not found")
        lines = text.splitlines(keepends=True)
        tail = int(request.params.get("tailLines", len(lines)))
        return aiohttp.web.Response(text="".join(lines[-tail:] if tail else []), content_type="text/plain")

    # ---- authentication and authorization -------------------------------------------------
    def _authorize(self, request, verb: str | None = None) -> None:
        """As the API server, before it serves anything: the bearer token names the user (401
        for one it does not know) and RBAC decides (403, with the server's message). `verb`:
        authorize the request for that verb instead of its own."""
        header = next((v for k, v in request.headers.items() if k.lower() == "authorization"), "")
        if self.authorizer is None or not header:
            return
        user = self.users.get(header.removeprefix("Bearer "))
        if user is None:
            self.refused.append("Unauthorized")
            raise kmock.KubernetesError(status=401, reason="Unauthorized", message="Unauthorized")
        attributes = rbac.request_attributes(getattr(request.method, "value", request.method), request.url.path,
                                             request.params)
        if verb is not None:
            attributes = dataclasses.replace(attributes, verb=verb)
        if not self.authorizer.allows(user, attributes):
            status = rbac.forbidden(user, attributes)
            self.refused.append(status["message"])
            raise kmock.KubernetesError(status=403, reason="Forbidden", message=status["message"],
                                        details=status["details"])

    def _access_review(self, request):
        """A SelfSubjectAccessReview: allowed unless the test denied that verb on that resource
        (in that namespace, or everywhere)."""
        attributes = (request.data.get("spec") or {}).get("resourceAttributes") or {}
        key = (attributes.get("verb"), attributes.get("resource"), attributes.get("namespace"))
        denied = key in self.denied or (key[0], key[1], None) in self.denied
        return aiohttp.web.json_response({**request.data, "status": {"allowed": not denied}}, status=201)

    # ---- the server's version ---------------------------------------------------------
    async def _serve_server_version(self, request):
        """A 1.33 server (kmock answers as 1.26, which the operator refuses: no Job successPolicy)."""
        return {**await super()._serve_server_version(request), "major": "1", "minor": "33",
                "gitVersion": VERSION}

    # ---- lists and watches by label ---------------------------------------------------
    async def _selected(self, request):
        if request.action == kmock.action.LIST:
            selector = request.params["labelSelector"]
            result = await super()._serve_list(request)
            result["items"] = [o for o in result["items"]
                               if _selector_matches(selector, o.get("metadata", {}).get("labels") or {})]
            result["metadata"]["resourceVersion"] = str(self._rv)
            return aiohttp.web.json_response(result)
        return await super()._handle(request)

    async def _serve_list(self, request):
        result = await super()._serve_list(request)
        result["metadata"]["resourceVersion"] = str(self._rv)
        return result

    async def _serve_watch(self, request):
        yield b""
        since = request.params.get("resourceVersion", "")
        since_rv = int(since) if since.isdigit() else None
        selector = request.params.get("labelSelector", "")
        bus = self._buses[request.resource]
        async with self._lock:  # subscribe atomically with the snapshot
            marker = await bus.mark()
            objs = self._KubernetesEmulator__get_objs(request, strict=False)
            events = [{"type": "ADDED" if since_rv is None else "MODIFIED", "object": o.raw}
                      for o in objs if not o.deleted
                      if since_rv is None or int(o.get("metadata", {}).get("resourceVersion") or 0) > since_rv]
        try:
            for event in events:
                if _selector_matches(selector, event["object"].get("metadata", {}).get("labels") or {}):
                    yield event
            async for event in bus.stream(since=marker):
                meta = event.get("object", {}).get("metadata", {})
                if self._KubernetesEmulator__check(request, request.resource, meta.get("namespace"),
                                                   meta.get("name"), strict=False) and \
                        _selector_matches(selector, meta.get("labels") or {}):
                    yield event
        finally:
            await bus.unmark(marker)

    async def _render_error(self, exc):
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):
            exc = kmock.KubernetesError(status=422, reason="Invalid", message=str(exc))
        return await super()._render_error(exc)


def _merge(current: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(current) if isinstance(current, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
RLJOBS, RLCLUSTERS = f"{API_VERSION}/rljobs", f"{API_VERSION}/rlclusters"


def register_kinds(emulator: kmock.KubernetesEmulator) -> None:
    """Built-in kinds (kopf needs v1/namespaces discoverable) and StreamRL's two CRDs."""
    emulator.resources.load_bundled()
    emulator.resources[RLJOBS] = kmock.ResourceInfo(kind="RLJob", singular="rljob", namespaced=True, verbs=VERBS,
                                                    subresources={"status", "scale"})
    emulator.resources[RLCLUSTERS] = kmock.ResourceInfo(kind="RLCluster", singular="rlcluster", namespaced=False,
                                                        verbs=VERBS, subresources={"status"})
