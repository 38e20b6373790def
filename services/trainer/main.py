"""`streamrl trainer`: the trainer process (coordinator + learner + weight publisher) in the
service shell. Serves gRPC (Rollout + health) for generators to dial; in colocated mode
an in-process generator (streamrl.local.colocated composes it) feeds the coordinator and no
gRPC is served.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Protocol

import torch
from prometheus_client import CollectorRegistry

from streamrl import compute
from streamrl.admin import merged_registry
from streamrl.checkpoints import JobIdentity
from streamrl.metrics import ServiceMetrics
from streamrl.models import load_model, load_tokenizer, weight_bytes
from streamrl.records import TrainerPhase, TrainerStatus
from streamrl.rewards import RewardError, sample_scorer
from streamrl.rollout.iteration import IterationPlanner
from streamrl.rollout.work import SamplingConfig
from streamrl.service import ExitCode, Service
from streamrl.spec import RLJob
from streamrl.tasks import load_prompts
from streamrl.trainer.checkpoint import CheckpointRefused, Checkpoints, begin_start
from streamrl.trainer.checkpointer import Checkpointer
from streamrl.trainer.coordinator import Coordinator
from streamrl.trainer.learner import Learner
from streamrl.trainer.lengths import setup_lengths
from streamrl.trainer.loop import TrainLoop
from streamrl.trainer.ranks import Ranks
from streamrl.trainer.recorder import Recorder
from streamrl.trainer.servicer import RolloutServicer
from streamrl.trainer.startup import Startup
from streamrl.weights import WeightStore
from streamrl.wire.model_files import read_model_files

log = logging.getLogger("streamrl.trainer")

FOLLOWER_GRACE_S = 30.0
"""After a signal, how long a rank other than 0 waits for rank 0 to stop it (once rank 0 has
written the summary and the model, which needs every rank) before it stops by itself."""


class InProcessGenerator(Protocol):
    """A generator inside the trainer's process (colocated mode)."""

    @property
    def registry(self) -> CollectorRegistry:
        """Its own metrics (the engine's busy time is not the trainer's), served beside the trainer's."""
        ...

    @property
    def compute(self) -> Executor:
        """Its engine thread, the process's compute thread: the learner's calls run there too."""
        ...

    def to_training(self) -> None:
        """Colocated's switch to training, on the engine's thread, before an iteration's first
        micro-batch: the idle engine lends its KV cache back to the learner."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


InProcessFactory = Callable[[Coordinator, WeightStore], InProcessGenerator]
"""Builds the in-process generator once the coordinator exists (on the running loop)."""


async def serve(job: RLJob, model_dir: Path, out_dir: Path, host: str = "127.0.0.1",
                endpoint_file: Path | None = None, ranker_address: str | None = None,
                admin_port: int | None = None, in_process: InProcessFactory | None = None,
                ranks: Ranks | None = None, preempted_exit_code: int = ExitCode.OK) -> int:
    """Train until every iteration is done (exit 0), SIGINT stops it (130), SIGTERM preempts
    it (`preempted_exit_code`, 0 by default: phase Preempted, resumable) or it fails (1);
    summary.json, a checkpoint (when stopped) and the final model are written on every way
    out. A start that finds a checkpoint of its run resumes from it. Rank 0 does all of that;
    the other ranks of a sharded trainer follow it (`follow`)."""
    spec, algo = job.spec, job.spec.algorithm
    ranks = ranks or Ranks()
    if admin_port is None:  # the spec's port, and the next ones for a pod's other ranks
        admin_port = spec.trainer.admin_port + ranks.local_rank if spec.trainer.admin_port else 0
    torch.manual_seed(algo.seed)
    if not ranks.is_leader:
        return await follow(job, model_dir, out_dir, ranks, host, admin_port, endpoint_file)
    metrics = ServiceMetrics("trainer", timeline=out_dir / "timeline" / "trainer.jsonl")
    startup = Startup(spec.trainer.startup, metrics.set_phase)
    startup.exit_on_signals(preempted_exit_code)
    started = time.monotonic()
    start = begin_start(out_dir, lambda: uuid.uuid4().hex[:12])
    run_id, incarnation = start.run_id, start.starts - 1
    running: TrainLoop | None = None  # once started
    resuming_at = 0  # the iteration of the checkpoint being resumed

    def status() -> TrainerStatus:
        if startup.starting or running is None:
            return TrainerStatus(run_id=run_id, phase=startup.phase or TrainerPhase.STARTING,
                                 mode=spec.pipeline.mode.value, iteration=resuming_at,
                                 num_iterations=algo.num_iterations, policy_version=0, num_samples_accepted=0,
                                 samples_per_s=0.0, uptime_s=time.monotonic() - started, incarnation=incarnation)
        records = recorder.records
        wall = sum(r.wall_s for r in records)
        return TrainerStatus(
            run_id=run_id, phase=running.phase, mode=spec.pipeline.mode.value, iteration=len(records),
            num_iterations=algo.num_iterations, policy_version=learner.policy_version,
            num_samples_accepted=coordinator.counters.num_samples_accepted,
            samples_per_s=sum(r.num_samples for r in records) / wall if wall else 0.0,
            uptime_s=time.monotonic() - started, last=running.last, **coordinator.status(),
            incarnation=incarnation, resumed_from=checkpointer.resumed_from,
            last_checkpoint=checkpointer.last,
        )

    # The admin server first: probes and the operator see the start's phase while the model and a
    # checkpoint load, each under its own bound (spec.trainer.startup); ready once training runs.
    in_process_registry = CollectorRegistry(auto_describe=False)  # colocated: the in-process generator's series
    registry = merged_registry(metrics.registry, in_process_registry) if in_process else metrics.registry
    shell = Service("trainer", registry, status, host, admin_port, endpoint_file, spec.security)
    shell.ready_when = lambda: running is not None and running.phase == TrainerPhase.RUNNING
    shell.waiting_for = startup.waiting_for
    shell.start_admin()
    log.info("trainer %s starting (start %d of its run); admin http://%s:%d", run_id, start.starts, host,
             shell.admin.port)

    # The ignores: transformers types a tokenizer's ids loosely (special-token ids are looked up
    # by __getattr__; decode takes any sequence of ids and returns a str for one).
    def encode(text: str) -> tuple[int, ...]:
        return (tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"])  # pyright: ignore[reportReturnType]

    def decode(token_ids: tuple[int, ...]) -> str:
        return tok.decode(token_ids, skip_special_tokens=True)  # pyright: ignore[reportReturnType, reportArgumentType]

    dispatch = spec.generators.dispatch
    planner = IterationPlanner(spec.pipeline, algo.num_iterations, algo.group_size, dispatch)
    coordinator = Coordinator(SamplingConfig(algo.temperature, algo.top_p, algo.max_new_tokens, algo.seed,
                                             incarnation),
                              sample_scorer(spec.reward.function, decode), metrics, algo.scale_advantages,
                              queue_factor=dispatch.effective_queue_factor,
                              relay_pools=frozenset(p.name for p in spec.generators.pools if p.weight_relay),
                              on_reward_error=spec.reward.on_error, dispatch=dispatch, demand=lambda: planner.demand)
    device = ranks.device(spec.trainer.device)
    store = WeightStore(spec.trainer.keep_versions, spec.trainer.weight_chunk_bytes)
    with startup.step(TrainerPhase.LOADING, "loadSeconds", f"the model to load from {model_dir}"):
        tok = load_tokenizer(model_dir)
        metrics.model_read_bytes.inc(weight_bytes(model_dir))
        learner = Learner(load_model(model_dir, spec.model.dtype, device), algo, device, ranks, spec.model.dtype,
                          metrics, spec.trainer.memory)
        local = in_process(coordinator, store) if in_process else None
    if local is not None:
        in_process_registry.register(local.registry)

    # Token ids beyond it are refused. The ignores: torch types an nn.Module's attributes
    # Tensor | Module (the model is a Hugging Face one).
    coordinator.set_vocab_size(learner.model.config.vocab_size)  # pyright: ignore[reportArgumentType, reportAttributeAccessIssue]
    identity = JobIdentity.of(job, json.loads((model_dir / "config.json").read_text()))
    checkpointer = Checkpointer(checkpoints=Checkpoints(out_dir, spec.checkpoint.keep), learner=learner,
                                identity=identity, run=start, metrics=metrics, out_dir=out_dir)
    try:
        found = checkpointer.find()
    except CheckpointRefused as err:
        log.error("not starting: %s", err)
        learner.stop()
        shell.admin.stop()
        return ExitCode.JOB_ERROR
    recorder = Recorder(out_dir, resume_at=found.state.iteration if found else None)

    def save_model(path: Path) -> None:
        # gathered whole from every rank
        learner.model.save_pretrained(path, state_dict=learner.weights())  # pyright: ignore[reportCallIssue] (as above)
        tok.save_pretrained(path)

    lengths = setup_lengths(spec, ranker_address)
    loop = TrainLoop(spec, coordinator=coordinator, planner=planner, learner=learner, store=store, encode=encode,
                     prompts=load_prompts(spec.task), recorder=recorder, metrics=metrics, save_model=save_model,
                     lengths=lengths, compute=local.compute if local else None,
                     before_training=local.to_training if local else None, checkpointer=checkpointer)
    if found:
        resuming_at = found.state.iteration
        with startup.step(TrainerPhase.RESUMING, "resumeSeconds",
                          f"the checkpoint of iteration {found.state.iteration} to load from {found.path}"):
            checkpointer.restore(found)
            loop.restore(found.state)
    running = loop
    startup.done()
    metrics.set_phase(loop.phase)
    if local is not None:
        local.start()
    else:
        # Replicas boot from the trainer: the model's config and tokenizer files are served as read here once.
        handler = RolloutServicer(coordinator, store, run_id, read_model_files(model_dir)).handler()
        await shell.start_grpc(lambda server: server.add_generic_rpc_handlers((handler,)), ("streamrl.v1.Rollout",),
                               spec.trainer.port)
    await shell.serving()
    log.info("trainer %s up: grpc %s, admin http://%s:%d, mode %s", run_id, shell.grpc_port or "none", host,
             shell.admin.port, spec.pipeline.mode.value)

    task = asyncio.ensure_future(loop.run())

    async def train() -> int:
        try:
            await task
            return ExitCode.OK
        except asyncio.CancelledError:
            loop.phase = loop.stopping or TrainerPhase.INTERRUPTED
            log.warning("trainer %s after %d iterations", loop.phase.value.lower(), len(recorder.records))
            return preempted_exit_code if loop.phase == TrainerPhase.PREEMPTED else ExitCode.INTERRUPTED
        except RewardError:
            loop.phase = TrainerPhase.FAILED
            log.exception("trainer failed: the job's reward function raised (reward.onError fail); a restart would "
                          "score the same completion again, so this exit (%d) asks for none", ExitCode.JOB_ERROR)
            return ExitCode.JOB_ERROR
        except Exception:
            loop.phase = TrainerPhase.FAILED
            log.exception("trainer failed")
            return ExitCode.FAILED
        finally:
            await loop.checkpoint_on_the_way_out()
            summary = recorder.summary(phase=loop.phase, mode=spec.pipeline.mode.value,
                                       weight_bytes_from_trainer=coordinator.relay.bytes_by_source.get("trainer", 0),
                                       weight_bytes_from_peers=coordinator.relay.bytes_by_source.get("peer", 0),
                                       generator_joins=coordinator.joins, incarnation=incarnation,
                                       resumed_from=checkpointer.resumed_from,
                                       last_checkpoint=checkpointer.last,
                                       checkpoint_wait_s=round(checkpointer.wait_s, 3),
                                       **coordinator.counters.totals())
            recorder.close()
            metrics.clock.close()
            save_model(out_dir / "model")
            log.info("summary: %s after %d iterations, %.1f samples/s, reward %.3f", summary.phase,
                     summary.num_iterations, summary.samples_per_s, summary.reward_mean)
            if loop.phase == TrainerPhase.SUCCEEDED:
                coordinator.close()  # the run is over: each generator's stream ends with OK, its goodbye
            # Otherwise the server's stop breaks the streams: generators keep their engines and
            # weights and dial again, for this run's next start.
            if lengths:
                await lengths.close()
            if local is not None:
                local.stop()
            learner.stop()

    def signalled(n: int) -> None:
        if n > 1:  # again: stop now (the checkpoint and model are still written on the way out)
            task.cancel()
            return
        phase = TrainerPhase.PREEMPTED if shell.last_signal == signal.SIGTERM else TrainerPhase.INTERRUPTED
        log.info("trainer: %s at the next safe point (a checkpoint is written first)", phase.value.lower())
        loop.stop_soon(phase)

    return await shell.run(train(), signalled)


async def follow(job: RLJob, model_dir: Path, out_dir: Path, ranks: Ranks, host: str, admin_port: int,
                 endpoint_file: Path | None = None) -> int:
    """A rank other than 0: its shard of the policy, the micro-batches rank 0 hands it and the
    collectives that close each step, until rank 0 says stop. It serves /metrics; signals do
    not stop it (rank 0 does, once its summary and model are written); a rank 0 that is gone
    ends it within the process group's timeout. Its busy/idle spans go to its own timeline file
    (a row of the run report)."""
    spec = job.spec
    metrics = ServiceMetrics("trainer", timeline=out_dir / "timeline" / f"trainer-rank-{ranks.rank}.jsonl")
    startup = Startup(spec.trainer.startup)
    startup.exit_on_signals(ExitCode.OK)
    learner: Learner | None = None

    def status() -> dict:
        if learner is None:
            return {"rank": ranks.rank, "world_size": ranks.world_size, "phase": TrainerPhase.LOADING.value,
                    "waiting_for": startup.waiting_for()}
        return {"rank": ranks.rank, "world_size": ranks.world_size, "policy_version": learner.policy_version}

    shell = Service(f"trainer rank {ranks.rank}", metrics.registry, status, host, admin_port, endpoint_file)
    shell.waiting_for = startup.waiting_for
    shell.start_admin()  # before the model loads: probes see the process (its rendezvous is behind it)
    device = ranks.device(spec.trainer.device)
    with startup.step(TrainerPhase.LOADING, "loadSeconds", f"its shard of the model to load from {model_dir}"):
        metrics.model_read_bytes.inc(weight_bytes(model_dir))
        learner = Learner(load_model(model_dir, spec.model.dtype, device), spec.algorithm, device, ranks,
                          spec.model.dtype, metrics, spec.trainer.memory)
    startup.done()  # a resume is rank 0's command, which this rank follows
    await shell.serving()
    log.info("trainer rank %d of %d following rank 0; admin http://%s:%d", ranks.rank, ranks.world_size, host,
             shell.admin.port)

    async def run() -> int:
        try:
            await asyncio.get_running_loop().run_in_executor(compute.executor("learner"), learner.follow, metrics.clock)
            return ExitCode.OK
        except Exception:
            log.exception("trainer rank %d failed", ranks.rank)
            return ExitCode.FAILED
        finally:
            metrics.clock.close()

    def signalled(n: int) -> None:
        if n > 1:  # rank 0 is not coming back for it: a collective cannot be cancelled, the process can
            log.warning("trainer rank %d: stopping at once", ranks.rank)
            os._exit(ExitCode.INTERRUPTED)
        log.info("trainer rank %d: leaving when rank 0 says so (it writes the summary and model first), or in "
                 "%.0f s", ranks.rank, FOLLOWER_GRACE_S)
        asyncio.get_running_loop().call_later(FOLLOWER_GRACE_S, signalled, 2)

    try:
        return await shell.run(run(), signalled)
    finally:
        ranks.close()
