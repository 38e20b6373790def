"""What `streamrl profile` measures of the trainer: the real Learner's forward/backward (a fixed
cost per micro-batch plus seconds per padded token, fitted over micro-batches of several shapes),
its optimizer step and publishing; and the real coordinator's seconds per sample, in process and
at each end of a loopback Connect stream from another process (streamrl.trainer.profile_sender).
Knows the learner and the coordinator, not the profile file."""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import sys
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
from streamrl.trainer.profile_sender import profile_sample
from streamrl.weights import WeightStore

SENDER_MODULE = "streamrl.trainer.profile_sender"
"""The replica's end of the stream measured, run as a process of its own."""
SENDER_TIMEOUT_S = 60.0
"""How long the profile waits for its sender process to connect, and then for each of its marks."""


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
    send_s: float
    """CPU seconds per sample of a replica's process sending it over a loopback Connect stream
    (each sample's hand-over to the event loop, its conversion, gRPC's threads; the work coming in)."""
    receive_s: float
    """CPU seconds per sample of the trainer's process taking it in from that stream, through the
    real servicer and coordinator (gRPC's threads, the conversion, the intake, the work going out)."""

    @property
    def stream_s(self) -> float:
        """Both ends."""
        return self.send_s + self.receive_s


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
                    coordinator.on_sample(replica.generator_id, profile_sample(work, i, completion_tokens, "profile-0"))
        if it:  # the first round warms up
            seconds.append((time.perf_counter() - t0) / (len(prompts) * group_size))
        await coordinator.take_groups(it, 1, len(prompts) * group_size)
    coordinator.disconnect(replica.generator_id)
    return statistics.median(seconds)


async def _connected(coordinator, sender: asyncio.subprocess.Process) -> None:
    """Once the sender process's stream is in; RuntimeError (with its stderr) if it exits first
    or takes longer than SENDER_TIMEOUT_S."""
    joined = asyncio.ensure_future(coordinator.wait_for_generators(1))
    exited = asyncio.ensure_future(sender.wait())
    done, _ = await asyncio.wait((joined, exited), timeout=SENDER_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    for task in (joined, exited):
        task.cancel()
    if joined in done:
        return
    what = f"exited with {sender.returncode}" if exited in done else f"did not connect within {SENDER_TIMEOUT_S:.0f} s"
    assert sender.stderr is not None  # a PIPE
    stderr = (await sender.stderr.read()).decode(errors="replace")[-2000:] if exited in done else ""
    raise RuntimeError(f"the profile's sender (python -m {SENDER_MODULE}) {what}" + (f":\n{stderr}" if stderr else ""))


async def _over_stream(coordinator, prompts, group_size: int, completion_tokens: int, capacity: int,
                       rounds: int, burst: int, step_s: float) -> tuple[float, float]:
    """(the sender's, the receiver's) CPU seconds per sample over a real Connect stream: this
    process serves it with the real servicer and coordinator, as the trainer does, and a replica's
    end streams from a process of its own (streamrl.trainer.profile_sender), so that each end
    pays its own wake-ups, its own event loop and its own gRPC threads, as it does in a run."""
    import grpc

    from streamrl.trainer.servicer import RolloutServicer
    from streamrl.wire.transfer import rollout_handler

    servicer = RolloutServicer(coordinator, WeightStore(1, 1 << 20), "profile")
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((rollout_handler(servicer.Connect, servicer.FetchWeights),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    per_round = len(prompts) * group_size
    sender = await asyncio.create_subprocess_exec(
        sys.executable, "-m", SENDER_MODULE, f"127.0.0.1:{port}", "--per-round", str(per_round),
        "--burst", str(burst), "--step-s", str(step_s), "--completion-tokens", str(completion_tokens),
        "--capacity", str(capacity), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    marks_out = sender.stdout
    assert marks_out is not None  # a PIPE

    async def mark() -> float:
        """The sender's CPU seconds as it is asked for a round's first sample."""
        line = await asyncio.wait_for(marks_out.readline(), SENDER_TIMEOUT_S)
        if not line.startswith(b"cpu "):
            raise RuntimeError(f"the profile's sender wrote {line!r} instead of its CPU time")
        return float(line.split()[1])

    try:
        await _connected(coordinator, sender)
        receiver_s, marks, accepted = [], [], coordinator.counters.num_samples_accepted
        # A warm-up round, `rounds` measured, and one more whose first sample marks the last one's end.
        for it in range(rounds + 2):
            t0 = time.process_time()
            coordinator.add_prompts(it, prompt_work(it, prompts), group_size, 0)
            marks.append(await mark())
            accepted += per_round
            waited = time.monotonic()
            while coordinator.counters.num_samples_accepted < accepted:  # the servicer's reader takes the last ones in
                if sender.returncode is not None or time.monotonic() - waited > SENDER_TIMEOUT_S:
                    raise RuntimeError(f"the profile's sender ({SENDER_MODULE}) stopped sending in round {it}: "
                                       f"{coordinator.counters.num_samples_accepted - accepted + per_round} of "
                                       f"{per_round} samples in; exit code {sender.returncode}")
                await asyncio.sleep(step_s)
            if 1 <= it <= rounds:
                receiver_s.append((time.process_time() - t0) / per_round)
            await coordinator.take_groups(it, 1, per_round)
        sender_s = [(b - a) / per_round for a, b in zip(marks[1:], marks[2:], strict=False)]
        return statistics.median(sender_s), statistics.median(receiver_s)
    finally:
        if sender.returncode is None:
            sender.kill()
        await sender.wait()
        await server.stop(1.0)


def measure_samples(scorer: Callable[[Sample, str], float], algo: AlgorithmSpec, vocab_size: int,
                    prompts: list[tuple[tuple[int, ...], str]], completion_tokens: int, capacity: int,
                    queue_factor: float, rounds: int = 3, step_s: float = 0.002) -> SampleMeasurement:
    """One iteration's work (`prompts`: token ids and answer, x groupSize samples of
    `completion_tokens` tokens, scored by the job's reward) for one replica of `capacity`
    sequences, taken in by the real coordinator (dispatching with `queue_factor`), `rounds`
    times after a warm-up (medians): in process, then over the stream as a replica sends them.
    A full batch finishes about capacity / completion_tokens samples per decode step
    (`step_s`, the engine's PTL at capacity), each handed to the event loop alone; each end of
    the stream costs its process's CPU seconds (every thread, gRPC's own included) per sample,
    the sender a process of its own. The tiny job, both ends in one process as profiles before
    version 6 measured them: 223-308 us a sample; in two, 110-181 us sending and 157-221 us
    receiving (in runs of the three disaggregated modes a replica spent 125-152 us a sample
    sending, its trainer 174-230 taking in). Samples written back-to-back cost about half as
    much (the tiny job: 125 against 208-238 us): gRPC coalesces them, and the event loop wakes
    once for many."""

    async def both() -> SampleMeasurement:
        args = (prompts, algo.group_size, completion_tokens, capacity, rounds)
        intake = await _in_process(coordinator_for(scorer, algo, vocab_size, queue_factor), *args)
        burst = max(1, round(capacity / max(1, completion_tokens)))
        send, receive = await _over_stream(coordinator_for(scorer, algo, vocab_size, queue_factor), *args, burst,
                                           step_s)
        return SampleMeasurement(intake, send, receive)

    quiet = logging.getLogger("streamrl.trainer")  # its replicas joining and leaving are no news here
    level, quiet.level = quiet.level, logging.ERROR
    try:
        return asyncio.run(both())
    finally:
        quiet.setLevel(level)
