"""`streamrl ranker`: the output-length ranker process (gRPC + admin HTTP) in the service
shell. SIGTERM stops it; its state is saved on the way out."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from streamrl.metrics import RankerMetrics
from streamrl.ranker.predictor import setup_predictor
from streamrl.ranker.ranker import Ranker
from streamrl.ranker.servicer import RankerServicer
from streamrl.service import ExitCode, Service
from streamrl.spec import RLJob
from streamrl.v1 import ranker_pb2_grpc

log = logging.getLogger("streamrl.ranker")


async def serve(job: RLJob, state_path: Path | None, host: str = "127.0.0.1", endpoint_file: Path | None = None,
                admin_port: int | None = None) -> int:
    """Serve until SIGTERM/SIGINT (exit 0)."""
    spec = job.spec.ranker
    state_path = state_path or (Path(spec.state_path) if spec.state_path else None)
    ranker = Ranker(setup_predictor(spec.predictor, spec.model_path, spec.device), state_path, spec.window,
                    spec.min_observations)
    metrics = RankerMetrics()
    servicer = RankerServicer(ranker, metrics)

    def status() -> dict:
        # Plain attributes, read without the servicer's lock; recall as last exported.
        return {"num_observed": ranker.num_observed, "predictor_ready": ranker.predictor_ready,
                "recall": {f"{k:.2f}": v for k, v in servicer.recall.items()}}

    shell = Service("ranker", metrics.registry, status, host, spec.admin_port if admin_port is None else admin_port,
                    endpoint_file, job.spec.security)
    shell.start_admin()
    port = await shell.start_grpc(lambda server: ranker_pb2_grpc.add_RankerServicer_to_server(servicer, server),
                                  ("streamrl.v1.Ranker",), spec.port)
    await shell.serving()
    log.info("ranker up: grpc %s:%d, admin http://%s:%d, state %s", host, port, host, shell.admin.port, state_path)
    stop = asyncio.Event()

    async def until_stopped() -> int:
        await stop.wait()
        await shell.leave()
        assert shell.server is not None  # started above
        await shell.server.stop(2)  # in-flight calls finish before the state is saved
        async with servicer.lock:
            await asyncio.to_thread(ranker.save)
        log.info("ranker stopped after %d observations", ranker.num_observed)
        return ExitCode.OK

    return await shell.run(until_stopped(), lambda n: stop.set())
