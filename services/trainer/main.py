"""`streamrl trainer`: the trainer process (coordinator + learner + weight publisher).

Serves gRPC (Rollout + health) for generators to dial and the HTTP admin surface; in
colocated mode it also runs the engine in-process and serves no gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import uuid
from pathlib import Path

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from streamrl.admin import AdminServer, merged_registry, write_endpoint
from streamrl.metrics import ServiceMetrics
from streamrl.models import load_model, load_tokenizer
from streamrl.records import TrainerPhase, TrainerStatus
from streamrl.rewards import get_reward
from streamrl.security import add_port, server_interceptors
from streamrl.spec import PipelineMode, RLJob
from streamrl.tasks import load_prompts
from streamrl.trainer.coordinator import Coordinator, SamplingConfig
from streamrl.trainer.learner import Learner
from streamrl.trainer.lengths import setup_lengths
from streamrl.trainer.local import LocalGenerator
from streamrl.trainer.loop import TrainLoop
from streamrl.trainer.recorder import Recorder
from streamrl.trainer.servicer import RolloutServicer
from streamrl.transfer import rollout_handler
from streamrl.weights import WeightStore
from streamrl.wire import GRPC_OPTIONS

log = logging.getLogger("streamrl.trainer")


async def serve(job: RLJob, model_dir: Path, out_dir: Path, host: str = "127.0.0.1",
                endpoint_file: Path | None = None, ranker_address: str | None = None,
                admin_port: int | None = None) -> int:
    spec = job.spec
    torch.manual_seed(spec.algorithm.seed)
    colocated = spec.pipeline.mode == PipelineMode.colocated
    metrics = ServiceMetrics("trainer", timeline=out_dir / "timeline" / "trainer.jsonl")
    tok = load_tokenizer(model_dir)
    reward_fn = get_reward(spec.reward.function)
    prompts = load_prompts(spec.task)

    def encode(text: str) -> tuple[int, ...]:
        return (tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"])

    def score(sample, answer: str) -> float:
        return float(reward_fn(tok.decode(sample.completion_token_ids, skip_special_tokens=True), answer))

    algo = spec.algorithm
    coordinator = Coordinator(SamplingConfig(algo.temperature, algo.top_p, algo.max_new_tokens, algo.seed),
                              score, metrics, algo.scale_advantages,
                              queue_factor=spec.generators.dispatch.effective_queue_factor,
                              relay_pools=frozenset(p.name for p in spec.generators.pools if p.weight_relay))
    learner = Learner(load_model(model_dir, spec.model.dtype, spec.trainer.device), algo, spec.trainer.device)
    store = WeightStore(spec.trainer.keep_versions, spec.trainer.weight_chunk_bytes)
    recorder = Recorder(out_dir)
    def save_model(path: Path) -> None:
        learner.model.save_pretrained(path)
        tok.save_pretrained(path)

    lengths = setup_lengths(spec, ranker_address)
    loop = TrainLoop(spec, coordinator, learner, store, encode, prompts, recorder, metrics, save_model, lengths)
    run_id = uuid.uuid4().hex[:12]
    started = time.monotonic()

    def status() -> TrainerStatus:
        records = recorder.records
        wall = sum(r.wall_s for r in records)
        return TrainerStatus(
            run_id=run_id, phase=loop.phase, mode=spec.pipeline.mode.value, iteration=len(records),
            num_iterations=algo.num_iterations, policy_version=learner.policy_version,
            num_samples_accepted=coordinator.num_samples_accepted,
            samples_per_s=sum(r.num_samples for r in records) / wall if wall else 0.0,
            uptime_s=time.monotonic() - started, last=loop.last, **coordinator.status(),
        )

    # Colocated: the in-process generator has its own metrics (the engine's busy time must
    # not count as the trainer's), served beside the trainer's.
    local_metrics = ServiceMetrics("generator", timeline=out_dir / "timeline" / "generator-local-0.jsonl") \
        if colocated else None
    registry = merged_registry(metrics.registry, local_metrics.registry) if local_metrics else metrics.registry
    admin = AdminServer(registry, status, lambda: loop.phase == TrainerPhase.RUNNING, host,
                        spec.trainer.admin_port if admin_port is None else admin_port)
    admin.start()
    server = None
    local = None
    endpoint = {"admin_port": admin.port, "grpc_port": None, "pid": None}
    if colocated:
        from streamrl.generator.engine import setup_engine

        pool = spec.generators.pools[0]
        engine = setup_engine(pool.engine, str(model_dir), spec.model.dtype, tok.eos_token_id)
        local = LocalGenerator(engine, coordinator, store, local_metrics)
        local.start()
    else:
        server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=server_interceptors(spec.security, aio=True))
        server.add_generic_rpc_handlers((rollout_handler(RolloutServicer(coordinator, store, run_id)),))
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        endpoint["grpc_port"] = add_port(server, f"{host}:{spec.trainer.port}", spec.security)
        await server.start()
        await health_servicer.set("streamrl.v1.Rollout", health_pb2.HealthCheckResponse.SERVING)
    endpoint["pid"] = os.getpid()
    write_endpoint(endpoint_file, endpoint)
    log.info("trainer %s up: grpc %s, admin http://%s:%d, mode %s", run_id, endpoint["grpc_port"], host,
             admin.port, spec.pipeline.mode.value)

    task = asyncio.ensure_future(loop.run())
    stop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        stop.add_signal_handler(sig, task.cancel)
    code = 0
    try:
        await task
    except asyncio.CancelledError:
        loop.phase = TrainerPhase.INTERRUPTED
        log.warning("trainer interrupted after %d iterations", len(recorder.records))
        code = 130
    except Exception:
        loop.phase = TrainerPhase.FAILED
        log.exception("trainer failed")
        code = 1
    finally:
        summary = recorder.summary(
            phase=loop.phase,
            mode=spec.pipeline.mode.value,
            num_prompts_dispatched=coordinator.num_prompts_dispatched,
            num_samples_accepted=coordinator.num_samples_accepted,
            num_samples_duplicate_dropped=coordinator.num_samples_duplicate_dropped,
            num_samples_redispatched=coordinator.num_samples_redispatched,
            num_samples_rejected=coordinator.num_samples_rejected,
            num_samples_stale_dropped=coordinator.num_samples_stale_dropped,
            weight_bytes_from_trainer=coordinator.weight_bytes_by_source.get("trainer", 0),
            weight_bytes_from_peers=coordinator.weight_bytes_by_source.get("peer", 0),
        )
        recorder.close()
        metrics.clock.close()
        save_model(out_dir / "model")
        log.info("summary: %s after %d iterations, %.1f samples/s, reward %.3f", summary.phase,
                 summary.num_iterations, summary.samples_per_s, summary.reward_mean)
        coordinator.close()
        if lengths:
            await lengths.close()
        if local:
            local.stop()
        if server:
            await server.stop(grace=2)
        admin.stop()
    return code
