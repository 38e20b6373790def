"""`streamrl ranker`: the output-length ranker process (gRPC + admin HTTP)."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from streamrl.admin import AdminServer, write_endpoint
from streamrl.metrics import RankerMetrics
from streamrl.ranker.predictor import setup_predictor
from streamrl.ranker.ranker import Ranker
from streamrl.ranker.servicer import RankerServicer
from streamrl.security import add_port, server_interceptors
from streamrl.spec import RLJob
from streamrl.v1 import ranker_pb2_grpc
from streamrl.wire import GRPC_OPTIONS

log = logging.getLogger("streamrl.ranker")


def serve(job: RLJob, state_path: Path | None, host: str = "127.0.0.1", endpoint_file: Path | None = None,
          admin_port: int | None = None) -> int:
    """Serve until SIGTERM/SIGINT; the state is saved on the way out."""
    spec = job.spec.ranker
    state_path = state_path or (Path(spec.state_path) if spec.state_path else None)
    ranker = Ranker(setup_predictor(spec.predictor, spec.model_path, spec.device), state_path, spec.window,
                    spec.min_observations)
    metrics = RankerMetrics()
    servicer = RankerServicer(ranker, metrics)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=GRPC_OPTIONS,
                         interceptors=server_interceptors(job.spec.security, aio=False))
    ranker_pb2_grpc.add_RankerServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = add_port(server, f"{host}:{spec.port}", job.spec.security)
    server.start()
    health_servicer.set("streamrl.v1.Ranker", health_pb2.HealthCheckResponse.SERVING)

    def status() -> dict:
        with servicer.lock:
            return {"num_observed": ranker.num_observed, "predictor_ready": ranker.predictor_ready,
                    "recall": {f"{k:.2f}": v for k, v in ranker.recall().items()}}

    admin = AdminServer(metrics.registry, status, lambda: True, host,
                        spec.admin_port if admin_port is None else admin_port).start()
    write_endpoint(endpoint_file, {"grpc_port": port, "admin_port": admin.port})
    log.info("ranker up: grpc %s:%d, admin http://%s:%d, state %s", host, port, host, admin.port, state_path)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=2).wait()
    with servicer.lock:
        ranker.save()
    admin.stop()
    log.info("ranker stopped after %d observations", ranker.num_observed)
    return 0
