"""What `streamrl profile` measures of the trainer: the real Learner's forward/backward (a fixed
cost per micro-batch plus seconds per padded token, fitted over micro-batches of several shapes),
its optimizer step and publishing; and the real coordinator's seconds per sample, in process and
over a loopback Connect stream. Knows the learner and the coordinator, not the profile file."""

from __future__ import annotations

import asyncio
import logging
import queue
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import torch

from streamrl import compute
from streamrl.latency import fit_fixed_plus_per_unit
from streamrl.samples import Group, Sample, ScoredSample
from streamrl.spec import AlgorithmSpec
from streamrl.trainer.learner import Learner
from streamrl.weights import WeightStore


@dataclass(frozen=True)
class TrainingMeasurement:
    micro_batch_size: int
    sequence_tokens: int
    """Prompt + completion tokens of the longest trained samples."""
    forward_backward_s_per_token: float
    """Seconds per padded token of a micro-batch (the fit's slope)."""
    forward_backward_s_per_micro_batch: float
    """Seconds every micro-batch costs whatever its size (the fit's intercept: packing, the loss, Python)."""
    optimizer_step_s: float
    publish_s: float


def synthetic_groups(num_samples: int, group_size: int, prompt_tokens: int, completion_tokens: int) -> list[Group]:
    """Scored groups of fixed lengths (ids 4..19, advantages +-1): what the learner trains on, minus meaning."""
    groups = []
    for g in range(-(-num_samples // group_size)):
        samples = tuple(
            ScoredSample(Sample(f"profile-{g}", i, tuple(4 + (i + k) % 16 for k in range(completion_tokens)),
                                (-1.0,) * completion_tokens, 0, "length"), 0.0, 1.0 if i % 2 else -1.0)
            for i in range(min(group_size, num_samples - g * group_size)))
        groups.append(Group(f"profile-{g}", 0, g, tuple(4 + k % 16 for k in range(prompt_tokens)), samples))
    return groups


def measure_training(model: torch.nn.Module, algo: AlgorithmSpec, device: str = "cpu", dtype: str = "float32",
                     prompt_tokens: int = 32, completion_tokens: int = 64, steps: int = 5,
                     chunk_bytes: int = 1 << 20, thread: Executor | None = None) -> TrainingMeasurement:
    """Single micro-batches of the shapes the job trains (see `training_shapes`), trained in
    turn: a warm-up step of each, then `steps` rounds of one step of every shape, each shape's
    median kept, so that the machine's speed drifting over the profile moves every shape alike
    and the fit's fixed part (what a stream's partial micro-batches cost beyond their tokens)
    stays put; the fit over them, the optimizer step and publishing (medians). On the process's
    compute thread (streamrl.compute), where the trainer's loop runs its learner: `thread`, when
    the caller holds it (`streamrl profile` measures the engine there too), else one of its own."""
    return compute.run(_measure_training, model, algo, device, dtype, prompt_tokens, completion_tokens, steps,
                       chunk_bytes, thread=thread, name="learner")


def training_shapes(micro_batch_size: int, completion_tokens: int, max_new_tokens: int) -> list[tuple[int, int]]:
    """(samples, completion tokens) of the micro-batches a profile trains: full ones at a quarter
    of `completion_tokens`, at it and at `max_new_tokens` (the longest a sample can be); and the
    partial ones a stream trains when a step's samples do not fill its last micro-batch (a half
    and a quarter of it, at lengths from a quarter to twice `completion_tokens`). Sorted, each
    once. Six profiles of the example job alternating on one core: with these shapes trained in
    turn the fit's fixed part read 3.5-5.6 ms and a half micro-batch's predicted cost 0.567-0.569
    of a full one's; with four shapes (no halves) measured one after another, 1.6-6.6 ms and
    0.534-0.590, while the machine's speed moved a full micro-batch 36-58 ms under both."""
    mb, c = micro_batch_size, max(1, completion_tokens)
    half, quarter = max(1, mb // 2), max(1, mb // 4)
    return sorted({(mb, max(1, c // 4)), (mb, c), (mb, max(1, max_new_tokens)), (half, c),
                   (half, max(1, min(2 * c, max_new_tokens))), (quarter, c), (quarter, max(1, c // 4))})


def _measure_training(model: torch.nn.Module, algo: AlgorithmSpec, device: str, dtype: str, prompt_tokens: int,
                      completion_tokens: int, steps: int, chunk_bytes: int) -> TrainingMeasurement:
    learner = Learner(model, algo, device=device, dtype=dtype)
    shapes = training_shapes(algo.micro_batch_size, completion_tokens, algo.max_new_tokens)
    batches = {shape: synthetic_groups(shape[0], algo.group_size, prompt_tokens, shape[1]) for shape in shapes}
    store = WeightStore(keep=1, chunk_bytes=chunk_bytes)
    seconds: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    optimizer_s, publish_s = [], []
    for step in range(steps + 1):
        for n, completion in shapes:
            learner.accumulate(batches[n, completion], n)
            stats = learner.step()
            t0 = time.perf_counter()
            store.publish(learner.policy_version, learner.weights())
            if step:  # the first round warms every shape up
                seconds[n, completion].append(stats.forward_backward_s)
                optimizer_s.append(stats.optimizer_s)
                publish_s.append(time.perf_counter() - t0)
    points = [(n * (prompt_tokens + completion), statistics.median(seconds[n, completion])) for n, completion in shapes]
    per_micro_batch, per_token = fit_fixed_plus_per_unit(points)
    return TrainingMeasurement(algo.micro_batch_size, prompt_tokens + completion_tokens, per_token, per_micro_batch,
                               statistics.median(optimizer_s), statistics.median(publish_s))


@dataclass(frozen=True)
class SampleMeasurement:
    intake_s: float
    """Seconds per sample of the coordinator's own work: checks, scoring, grouping, dispatching more."""
    stream_s: float
    """CPU seconds per sample over a loopback Connect stream through the real servicer, both
    ends in this one process, sent as a replica sends them: the work going out, each sample's
    hand-over to the event loop and conversion, gRPC and intake."""


def coordinator_for(scorer: Callable[[Sample, str], float], algo: AlgorithmSpec, vocab_size: int,
                    queue_factor: float):
    """A real coordinator for measuring the job's sample path (its sampling, reward and dispatch)."""
    from streamrl.metrics import ServiceMetrics
    from streamrl.rollout.work import SamplingConfig
    from streamrl.trainer.coordinator import Coordinator

    sampling = SamplingConfig(algo.temperature, algo.top_p, algo.max_new_tokens, algo.seed)
    return Coordinator(sampling, scorer, ServiceMetrics("trainer"), algo.scale_advantages, queue_factor,
                       vocab_size=vocab_size)


def prompt_work(iteration: int, prompts: list[tuple[tuple[int, ...], str]]):
    """An iteration's prompts (token ids, answer) as the trainer's loop hands them to the coordinator."""
    from streamrl.rollout.work import PromptWork

    return [PromptWork(f"{iteration}-{k}-{k}", k, answer, ids) for k, (ids, answer) in enumerate(prompts)]


def _sample(work, index: int, completion_tokens: int, generator_id: str) -> Sample:
    ids = tuple(4 + (index + k) % 16 for k in range(completion_tokens))
    return Sample(work.prompt_id, index, ids, (-1.0,) * completion_tokens, 0, "length", generator_id)


async def _in_process(coordinator, prompts, group_size: int, completion_tokens: int, capacity: int,
                      rounds: int) -> float:
    from streamrl.messages import Hello, Work

    replica = coordinator.connect(Hello("profile-0", "default", capacity, "torch", 0))
    seconds = []
    for it in range(rounds + 1):
        t0 = time.perf_counter()
        coordinator.add_prompts(it, prompt_work(it, prompts), group_size, 0)
        while not replica.outbox.empty():  # each sample's intake dispatches more work, as the trainer's does
            work = replica.outbox.get_nowait()
            if isinstance(work, Work):
                for i in work.sample_indices:
                    coordinator.on_sample(replica.generator_id, _sample(work, i, completion_tokens, "profile-0"))
        if it:  # the first round warms up
            seconds.append((time.perf_counter() - t0) / (len(prompts) * group_size))
        await coordinator.take_groups(it, 1, len(prompts) * group_size)
    coordinator.disconnect(replica.generator_id)
    return statistics.median(seconds)


async def _over_stream(coordinator, prompts, group_size: int, completion_tokens: int, capacity: int,
                       rounds: int, burst: int, step_s: float) -> float:
    import grpc

    from streamrl.messages import Hello, Work
    from streamrl.trainer.servicer import RolloutServicer
    from streamrl.v1 import rollout_pb2 as pb
    from streamrl.wire.convert import request_to_pb, response_from_pb
    from streamrl.wire.transfer import rollout_handler

    servicer = RolloutServicer(coordinator, WeightStore(1, 1 << 20), "profile")
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((rollout_handler(servicer.Connect, servicer.FetchWeights),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    loop = asyncio.get_running_loop()
    outbox: asyncio.Queue = asyncio.Queue()
    finished: queue.Queue = queue.Queue()

    async def requests():  # as the agent streams: Hello, then whatever the engine thread hands over
        yield request_to_pb(Hello("profile-1", "default", capacity, "torch", 0))
        while (msg := await outbox.get()) is not None:
            yield request_to_pb(msg)

    def engine() -> None:  # as a replica's engine thread: up to `burst` samples per decode step
        while (sample := finished.get()) is not None:
            done = [sample]
            while len(done) < burst and not finished.empty():
                done.append(finished.get_nowait())
            for s in done:  # handed to the event loop one by one, as GeneratorAgent._from_engine does
                loop.call_soon_threadsafe(outbox.put_nowait, s)
            time.sleep(step_s)  # the next decode step, off this process's CPU

    thread = threading.Thread(target=engine, name="profile-engine", daemon=True)
    thread.start()
    try:
        call = channel.stream_stream("/streamrl.v1.Rollout/Connect",
                                     request_serializer=pb.ConnectRequest.SerializeToString,
                                     response_deserializer=pb.ConnectResponse.FromString)(requests())
        per_round = len(prompts) * group_size
        await call.read()  # Welcome
        seconds, accepted = [], coordinator.counters.num_samples_accepted
        for it in range(rounds + 1):
            t0 = time.process_time()
            coordinator.add_prompts(it, prompt_work(it, prompts), group_size, 0)
            sent = 0
            while sent < per_round:  # answer each Work as a generator does
                response = await call.read()
                assert isinstance(response, pb.ConnectResponse)  # the stream ends after the last round
                work = response_from_pb(response)
                if isinstance(work, Work):
                    for i in work.sample_indices:
                        finished.put(_sample(work, i, completion_tokens, "profile-1"))
                        sent += 1
            accepted += per_round
            while coordinator.counters.num_samples_accepted < accepted:
                await asyncio.sleep(step_s)  # the servicer's reader takes the last ones in
            if it:
                seconds.append((time.process_time() - t0) / per_round)
            await coordinator.take_groups(it, 1, per_round)
        outbox.put_nowait(None)  # done writing: the servicer ends the stream, then the channel closes cleanly
        while await asyncio.wait_for(call.read(), 10) is not grpc.aio.EOF:  # pyright: ignore[reportAttributeAccessIssue] (typeshed's grpc lacks aio.EOF)
            pass
        return statistics.median(seconds)
    finally:
        finished.put(None)
        thread.join()
        await server.stop(1.0)
        await channel.close()


def measure_samples(scorer: Callable[[Sample, str], float], algo: AlgorithmSpec, vocab_size: int,
                    prompts: list[tuple[tuple[int, ...], str]], completion_tokens: int, capacity: int,
                    queue_factor: float, rounds: int = 3, step_s: float = 0.002) -> SampleMeasurement:
    """One iteration's work (`prompts`: token ids and answer, x groupSize samples of
    `completion_tokens` tokens, scored by the job's reward) for one replica of `capacity`
    sequences, taken in by the real coordinator (dispatching with `queue_factor`), `rounds`
    times after a warm-up (medians): in process, then over the stream as a replica sends them.
    A full batch finishes about capacity / completion_tokens samples per decode step
    (`step_s`, the engine's PTL at capacity), each handed to the event loop alone; the stream's
    cost is the process's CPU seconds (every thread, gRPC's own included) per sample. Samples
    written back-to-back cost about half as much (the tiny job: 125 against 208-238 us): gRPC
    coalesces them, and the event loop wakes once for many."""

    async def both() -> SampleMeasurement:
        args = (prompts, algo.group_size, completion_tokens, capacity, rounds)
        intake = await _in_process(coordinator_for(scorer, algo, vocab_size, queue_factor), *args)
        burst = max(1, round(capacity / max(1, completion_tokens)))
        stream = await _over_stream(coordinator_for(scorer, algo, vocab_size, queue_factor), *args, burst, step_s)
        return SampleMeasurement(intake, stream)

    quiet = logging.getLogger("streamrl.trainer")  # its replicas joining and leaving are no news here
    level, quiet.level = quiet.level, logging.ERROR
    try:
        return asyncio.run(both())
    finally:
        quiet.setLevel(level)
