"""The HTTP admin surface every service serves: /healthz, /readyz, /metrics, /status.

Runs uvicorn in a daemon thread on a socket bound up front, so port 0 works and the
chosen port is known before anything dials it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from pydantic import BaseModel

from streamrl.wire.addresses import listening_socket


class _Merged:
    """Several registries as one exposition: families of the same name are joined, and a
    series (name and labels) already seen is not repeated."""

    def __init__(self, registries: tuple[CollectorRegistry, ...]):
        self.registries = registries

    def collect(self):
        families: dict[str, Metric] = {}
        seen: set[tuple] = set()
        for registry in self.registries:
            for fam in registry.collect():
                out = families.get(fam.name)
                if out is None:
                    out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                for sample in fam.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if key not in seen:
                        seen.add(key)
                        out.samples.append(sample)
        yield from families.values()


def merged_registry(*registries: CollectorRegistry) -> CollectorRegistry:
    """One registry serving the series of several (e.g. a trainer with an in-process generator)."""
    merged = CollectorRegistry(auto_describe=False)
    merged.register(_Merged(registries))
    return merged


class AdminServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        status: Callable[[], BaseModel | dict[str, Any]],
        ready: Callable[[], bool],
        host: str = "127.0.0.1",
        port: int = 0,
        waiting_for: Callable[[], str] = lambda: "",
    ):
        """`waiting_for`: what keeps the service from being ready ("" when nothing in
        particular), the `waiting_for` of a 503 /readyz body."""
        import uvicorn
        from fastapi import FastAPI, Response
        from fastapi.responses import JSONResponse

        app = FastAPI(title="streamrl admin", docs_url=None, redoc_url=None)

        @app.get("/healthz")
        def healthz() -> dict:
            return {"ok": True}

        @app.get("/readyz")
        def readyz() -> Response:
            ok = ready()
            why = "" if ok else waiting_for()
            return JSONResponse({"ready": ok, **({"waiting_for": why} if why else {})}, status_code=200 if ok else 503)

        @app.get("/metrics")
        def metrics() -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

        @app.get("/status")
        def status_() -> dict:
            body = status()
            return body.model_dump(mode="json", exclude_none=True) if isinstance(body, BaseModel) else body

        self._sock = listening_socket(host, port)  # `::`: IPv6 and IPv4 (probes on either kind of cluster)
        self.port = self._sock.getsockname()[1]
        self.host = host
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                        name="admin-http")

    def start(self) -> AdminServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
