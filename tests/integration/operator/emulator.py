"""kmock (kopf's Kubernetes API emulator) made faithful enough for kopf: kmock 0.8 stores
bodies verbatim and replays watches without resourceVersion semantics, which makes kopf
run handlers twice or wait forever. This subclass stamps uid/namespace/resourceVersion/
generation, subscribes watches atomically with their replay, reports failed JSON-patch
tests as 422 and, as the API server does, refuses to change a Job's pod template. It
reaches into kmock's private methods: kmock is pinned (pyproject.toml)."""

from __future__ import annotations

import datetime
import uuid

import jsonpatch
import kmock

from streamrl.spec import API_VERSION


class Emulator(kmock.KubernetesEmulator):
    _rv: int = 1000

    def _next_rv(self) -> str:
        type(self)._rv += 1
        return str(self._rv)

    async def _handle(self, request):
        data = request.data
        self._refuse_immutable_job_fields(request)
        if request.resource is not None and request.action in (kmock.action.CREATE, kmock.action.UPDATE):
            rv = self._next_rv()
            if isinstance(data, dict):
                meta = data.setdefault("metadata", {})
                if request.action == kmock.action.CREATE:
                    if not meta.get("name") and meta.get("generateName"):
                        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                    if request.namespace:
                        meta.setdefault("namespace", request.namespace)
                    meta.setdefault("uid", str(uuid.uuid4()))
                    meta.setdefault("generation", 1)
                    meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).isoformat())
                meta["resourceVersion"] = rv
            elif isinstance(data, list):  # JSON-patch (kopf's finalizers)
                data.append({"op": "add", "path": "/metadata/resourceVersion", "value": rv})
        return await super()._handle(request)

    def _refuse_immutable_job_fields(self, request) -> None:
        """As the API server does: a Job's pod template, completions and completion mode never
        change (suspend and parallelism may)."""
        if request.action != kmock.action.UPDATE or not isinstance(request.data, dict) or request.name is None:
            return
        resource = request.resource
        if (resource.group, resource.plural) != ("batch", "jobs") or "spec" not in request.data:
            return
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return
        current, patch = self.objects[key].raw.get("spec", {}), request.data["spec"]
        for field in ("template", "completions", "completionMode"):
            if field in patch and patch[field] != current.get(field):
                raise kmock.KubernetesError(status=422, reason="Invalid",
                                            message=f"Job.batch {request.name!r} is invalid: spec.{field}: "
                                                    "field is immutable")

    async def _serve_list(self, request):
        result = await super()._serve_list(request)
        result["metadata"]["resourceVersion"] = str(self._rv)
        return result

    async def _serve_watch(self, request):
        yield b""
        since = request.params.get("resourceVersion", "")
        since_rv = int(since) if since.isdigit() else None
        bus = self._buses[request.resource]
        async with self._lock:  # subscribe atomically with the snapshot
            marker = await bus.mark()
            objs = self._KubernetesEmulator__get_objs(request, strict=False)
            events = [{"type": "ADDED" if since_rv is None else "MODIFIED", "object": o.raw}
                      for o in objs if not o.deleted
                      if since_rv is None or int(o.get("metadata", {}).get("resourceVersion") or 0) > since_rv]
        try:
            for event in events:
                yield event
            async for event in bus.stream(since=marker):
                meta = event.get("object", {}).get("metadata", {})
                if self._KubernetesEmulator__check(request, request.resource, meta.get("namespace"),
                                                   meta.get("name"), strict=False):
                    yield event
        finally:
            await bus.unmark(marker)

    async def _render_error(self, exc):
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):
            exc = kmock.KubernetesError(status=422, reason="Invalid", message=str(exc))
        return await super()._render_error(exc)


VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
RLJOBS, RLCLUSTERS = f"{API_VERSION}/rljobs", f"{API_VERSION}/rlclusters"


def register_kinds(emulator: kmock.KubernetesEmulator) -> None:
    """Built-in kinds (kopf needs v1/namespaces discoverable) and StreamRL's two CRDs."""
    emulator.resources.load_bundled()
    emulator.resources[RLJOBS] = kmock.ResourceInfo(kind="RLJob", singular="rljob", namespaced=True, verbs=VERBS,
                                                    subresources={"status"})
    emulator.resources[RLCLUSTERS] = kmock.ResourceInfo(kind="RLCluster", singular="rlcluster", namespaced=False,
                                                        verbs=VERBS, subresources={"status"})
