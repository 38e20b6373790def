"""`streamrl generator`: one generator replica (engine + agent, and its relay on the shell's
gRPC server) in the service shell. It boots from the trainer: the model's config and
tokenizer files come over FetchModel, the weights as the version the trainer tells it to
fetch, so it needs no model directory (given one, it loads from it instead). SIGTERM drains
it (scale-down, pod deletion); a second one stops it at once. A trainer that goes away is
dialled again (spec.generators.reconnect); one not there yet is waited for."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from streamrl.generator.agent import GeneratorAgent
from streamrl.generator.engine import setup_engine
from streamrl.generator.relay import Relay
from streamrl.metrics import ServiceMetrics
from streamrl.models import eos_token_id, weight_bytes
from streamrl.service import Service, process_started_unix
from streamrl.spec import RLJob
from streamrl.wire.addresses import join_host_port
from streamrl.wire.channels import open_channel
from streamrl.wire.model_files import wait_for_model_files

log = logging.getLogger("streamrl.generator")


async def serve(job: RLJob, pool_name: str, trainer_address: str, model_dir: Path | None,
                generator_id: str | None = None,
                host: str = "127.0.0.1", admin_port: int = 0, relay_port: int = 0, advertise_host: str | None = None,
                endpoint_file: Path | None = None, timeline: Path | None = None) -> int:
    """Serve until the trainer closes the stream (exit 0), a drain completes (0), or the trainer
    refuses it or, when spec.generators.reconnect.giveUpAfterSeconds is set, stays unreachable
    that long (1); unset, an absent trainer is waited for, not ready meanwhile, /readyz and the
    log saying what it waits for. Without `model_dir` it boots from the trainer."""
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
    # monotonic seconds since it waits for the model's files from the trainer
    booting: dict[str, float | None] = {"since": None}

    def waiting_for() -> str:
        agent = up.get("agent")
        if agent is not None:
            return agent.waiting_for()
        if booting["since"] is not None:
            return (f"the model's files from the trainer at {trainer_address} (waiting "
                    f"{time.monotonic() - booting['since']:.0f}s)")
        return "its engine to load"

    def status() -> dict:
        agent = up.get("agent")
        if agent is None:
            return {"generator_id": gid, "pool": pool.name, "phase": "Loading", "waiting_for": waiting_for()}
        st = agent.engine.stats()
        phase = ("Serving" if agent.connected.is_set() else "Reconnecting" if agent.run_id
                 else "WaitingForTrainer")
        return {"generator_id": gid, "pool": pool.name, "phase": phase, "waiting_for": waiting_for(),
                "run_id": agent.run_id,
                "num_reconnects": agent.num_reconnects,
                "policy_version": agent.engine.policy_version, "num_running": st.num_running,
                "num_waiting": st.num_waiting, "num_generated_tokens": st.num_generated_tokens,
                "capacity": st.capacity}

    shell = Service("generator", metrics.registry, status, host, admin_port, endpoint_file, spec.security)
    shell.ready_when = lambda: "agent" in up and up["agent"].connected.is_set()
    shell.waiting_for = waiting_for
    shell.start_admin()  # scrapes see the replica while its model loads (and every counter from zero)
    booted = None  # the directory of the model's files fetched from the trainer (removed on the way out)
    try:
        if model_dir is None:
            booted = model_dir = Path(tempfile.mkdtemp(prefix="streamrl-model-"))
            booting["since"] = time.monotonic()
            names = await wait_for_model_files(lambda address: open_channel(address, spec.security), model_dir,
                                               trainer_address, spec.generators.reconnect.give_up_after_seconds)
            booting["since"] = None
            log.info("booting from the trainer: %d model files (%s) %.1fs after the process started; the weights "
                     "come as the trainer's current version", len(names), ", ".join(names), time.time() - started)
        if booted is None:
            metrics.model_read_bytes.inc(weight_bytes(model_dir))
        engine = setup_engine(pool.engine, str(model_dir), spec.model.dtype, eos_token_id(model_dir),
                              weights=booted is None, threads=pool.threads)
        log.info("engine %s %.1fs after the process started", "built (no weights yet)" if booted else "loaded",
                 time.time() - started)
        relay = None
        if pool.weight_relay:
            relay = Relay(spec.trainer.keep_versions, spec.trainer.weight_chunk_bytes)
            port = await shell.start_grpc(lambda server: server.add_generic_rpc_handlers((relay.handler(),)),
                                          ("streamrl.v1.Rollout",), relay_port)
            relay.address = join_host_port(advertise_host or host, port)  # POD_IP: IPv4 or IPv6
        agent = up["agent"] = GeneratorAgent(engine, trainer_address, gid, pool.name, metrics, pool.engine.type,
                                             relay, spec.security, spec.generators.dispatch.low_occupancy, started,
                                             spec.generators.reconnect, spec.pipeline.in_flight_updates)
        await shell.serving()
        log.info("generator %s (pool %s, %s engine, batch %d) dialling %s; admin http://%s:%d", gid, pool.name,
                 pool.engine.type, engine.stats().capacity, trainer_address, host, shell.admin.port)
        return await shell.run(agent.run(), lambda n: agent.drain("SIGTERM") if n == 1 else agent.stop())
    finally:
        metrics.clock.close()
        await shell.stop()
        if booted is not None:
            shutil.rmtree(booted, ignore_errors=True)
