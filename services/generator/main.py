"""`streamrl generator`: one generator replica process (engine + agent + admin HTTP)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path

from streamrl.admin import AdminServer, write_endpoint
from streamrl.generator.agent import GeneratorAgent
from streamrl.generator.engine import setup_engine
from streamrl.metrics import ServiceMetrics
from streamrl.models import load_tokenizer
from streamrl.security import open_channel
from streamrl.spec import RLJob
from streamrl.transfer import RelayServer

log = logging.getLogger("streamrl.generator")


def serve(job: RLJob, pool_name: str, trainer_address: str, model_dir: Path, generator_id: str | None = None,
          host: str = "127.0.0.1", admin_port: int = 0, relay_port: int = 0, advertise_host: str | None = None,
          endpoint_file: Path | None = None, timeline: Path | None = None) -> int:
    """Serve until the trainer closes the stream (exit 0), SIGTERM (0) or a broken link (1)."""
    pools = {p.name: p for p in job.spec.generators.pools}
    if pool_name not in pools:
        raise ValueError(f"--pool {pool_name!r}: not in spec.generators.pools ({', '.join(pools)})")
    pool = pools[pool_name]
    metrics = ServiceMetrics("generator", timeline)
    gid = generator_id or f"{pool.name}-{socket.gethostname()}-{os.getpid()}"
    up: dict = {}  # engine and agent, once loaded

    def status() -> dict:
        engine = up.get("engine")
        if engine is None:
            return {"generator_id": gid, "pool": pool.name, "phase": "Loading"}
        st = engine.stats()
        return {"generator_id": gid, "pool": pool.name, "phase": "Serving", "policy_version": engine.policy_version,
                "num_running": st.num_running, "num_waiting": st.num_waiting,
                "num_generated_tokens": st.num_generated_tokens, "capacity": st.capacity}

    # The admin surface comes up first, so health checks and scrapes see the replica while
    # its model loads (and every counter from zero).
    admin = AdminServer(metrics.registry, status, lambda: "agent" in up and up["agent"].connected.is_set(), host,
                        admin_port).start()
    try:
        eos = load_tokenizer(model_dir).eos_token_id
        engine = up["engine"] = setup_engine(pool.engine, str(model_dir), job.spec.model.dtype, eos)
        relay = None
        if pool.weight_relay:
            relay = RelayServer(job.spec.trainer.keep_versions, job.spec.trainer.weight_chunk_bytes, host, relay_port,
                                job.spec.security)
            if advertise_host:
                relay.address = f"{advertise_host}:{relay.port}"
        agent = up["agent"] = GeneratorAgent(
            engine, trainer_address, gid, pool.name, metrics, pool.engine.type, relay,
            channel_factory=lambda address: open_channel(address, job.spec.security))
        agent.worker.low_occupancy = job.spec.generators.dispatch.low_occupancy
        write_endpoint(endpoint_file, {"admin_port": admin.port, "relay_port": relay.port if relay else 0,
                                       "pid": os.getpid()})
        # SIGTERM drains (scale-down, pod deletion); a second one stops at once. The handler
        # only sets an event: it interrupts the main thread, which may hold a queue's lock.
        terminate = threading.Event()

        def on_terminate() -> None:
            while True:
                terminate.wait()
                terminate.clear()
                agent.drain("SIGTERM")

        threading.Thread(target=on_terminate, name="sigterm", daemon=True).start()
        signal.signal(signal.SIGTERM, lambda *_: terminate.set())
        log.info("generator %s (pool %s, %s engine, batch %d) dialling %s; admin http://%s:%d", gid, pool.name,
                 pool.engine.type, engine.stats().capacity, trainer_address, host, admin.port)
        return agent.run()
    finally:
        metrics.clock.close()
        admin.stop()
