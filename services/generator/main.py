"""`streamrl generator`: one generator replica (engine + agent, and its relay on the shell's
gRPC server) in the service shell. SIGTERM drains it (scale-down, pod deletion); a second
one stops it at once. A trainer that goes away is dialled again (spec.generators.reconnect)."""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

from streamrl.generator.agent import GeneratorAgent
from streamrl.generator.engine import setup_engine
from streamrl.generator.relay import Relay
from streamrl.metrics import ServiceMetrics
from streamrl.models import eos_token_id
from streamrl.service import Service, process_started_unix
from streamrl.spec import RLJob

log = logging.getLogger("streamrl.generator")


async def serve(job: RLJob, pool_name: str, trainer_address: str, model_dir: Path, generator_id: str | None = None,
                host: str = "127.0.0.1", admin_port: int = 0, relay_port: int = 0, advertise_host: str | None = None,
                endpoint_file: Path | None = None, timeline: Path | None = None) -> int:
    """Serve until the trainer closes the stream (exit 0), a drain completes (0), or the trainer
    refuses it or stays unreachable for spec.generators.reconnect.giveUpAfterSeconds after a
    break (1)."""
    started = process_started_unix()
    log.info("imports done %.1fs after the process started", time.time() - started)
    spec = job.spec
    pools = {p.name: p for p in spec.generators.pools}
    if pool_name not in pools:
        raise ValueError(f"--pool {pool_name!r}: not in spec.generators.pools ({', '.join(pools)})")
    pool = pools[pool_name]
    metrics = ServiceMetrics("generator", timeline)
    gid = generator_id or f"{pool.name}-{socket.gethostname()}-{os.getpid()}"
    up: dict[str, GeneratorAgent] = {}  # the agent, once the engine is loaded

    def status() -> dict:
        agent = up.get("agent")
        if agent is None:
            return {"generator_id": gid, "pool": pool.name, "phase": "Loading"}
        st = agent.engine.stats()
        phase = "Reconnecting" if agent.run_id and not agent.connected.is_set() else "Serving"
        return {"generator_id": gid, "pool": pool.name, "phase": phase, "run_id": agent.run_id,
                "num_reconnects": agent.num_reconnects,
                "policy_version": agent.engine.policy_version, "num_running": st.num_running,
                "num_waiting": st.num_waiting, "num_generated_tokens": st.num_generated_tokens,
                "capacity": st.capacity}

    shell = Service("generator", metrics.registry, status, host, admin_port, endpoint_file, spec.security)
    shell.ready_when = lambda: "agent" in up and up["agent"].connected.is_set()
    shell.start_admin()  # scrapes see the replica while its model loads (and every counter from zero)
    try:
        engine = setup_engine(pool.engine, str(model_dir), spec.model.dtype, eos_token_id(model_dir))
        log.info("engine loaded %.1fs after the process started", time.time() - started)
        relay = None
        if pool.weight_relay:
            relay = Relay(spec.trainer.keep_versions, spec.trainer.weight_chunk_bytes)
            port = await shell.start_grpc(lambda server: server.add_generic_rpc_handlers((relay.handler(),)),
                                          ("streamrl.v1.Rollout",), relay_port)
            relay.address = f"{advertise_host or host}:{port}"
        agent = up["agent"] = GeneratorAgent(engine, trainer_address, gid, pool.name, metrics, pool.engine.type,
                                             relay, spec.security, spec.generators.dispatch.low_occupancy, started,
                                             spec.generators.reconnect)
        await shell.serving()
        log.info("generator %s (pool %s, %s engine, batch %d) dialling %s; admin http://%s:%d", gid, pool.name,
                 pool.engine.type, engine.stats().capacity, trainer_address, host, shell.admin.port)
        return await shell.run(agent.run(), lambda n: agent.drain("SIGTERM") if n == 1 else agent.stop())
    finally:
        metrics.clock.close()
        await shell.stop()
