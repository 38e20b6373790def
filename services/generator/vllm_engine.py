"""vLLM behind the generator's Engine interface: token ids in, the sampled tokens and their
logprobs at the sampling temperature out, each policy version loaded in place. Knows token ids
and tensor names only.

vLLM's engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), stepped by the
generator's engine thread like the torch engine, so a step is one scheduler iteration and its
time is the replica's PTL. Admission stays the generator's: requests wait here in our order
(highest priority first, then arrival) and join vLLM while it runs fewer than the batch cap;
inside vLLM they keep that order through its priority scheduling (which also picks whom to
preempt when the KV cache runs out).

Logprobs are vLLM's processed ones: after temperature, as the torch engine's, and, where
algorithm.topP < 1, also after the nucleus cut (renormalised over it), where the torch engine's
are taken before it. At topP 1 (the default) the two engines agree (tests/integration).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from streamrl import compute
from streamrl.generator.engine import Completion, Engine, EngineStats, GenerationRequest, WaitingRequests
from streamrl.latency import ServedLatency
from streamrl.samples import version_runs
from streamrl.spec import VllmEngineSpec
from streamrl.vllm_args import engine_kwargs

VERSION_LOADER = "streamrl.generator.vllm_worker.VersionLoader"
log = logging.getLogger(__name__)

VERSIONS_PREFIX = "streamrl-vllm-"
"""Version directories are named <prefix><pid>-v<version>-<random> in versions_base()."""

PRIORITY_SCALE = 1000
"""vLLM's priorities are integers (lower first): ours (higher first, fractional) times this, negated."""


@dataclass
class _RunningInVllm:
    request: GenerationRequest
    admitted_at: float
    queued_s: float
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """The weight version that sampled each token (the one held at the step that returned it)."""


def parameter_shapes(model_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """The policy's parameters (names as in its named_parameters, tied embeddings once) and
    shapes, from the directory's config alone (built on the meta device: no memory, no weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def versions_base() -> Path:
    """Where versions are written: memory-backed /dev/shm where it exists (a pod's is a tmpfs),
    else the temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def sleep_mode_available() -> bool:
    """Whether vLLM can sleep on this platform (release its KV cache and weights for a colocated
    trainer): CUDA, ROCm and XPU, not CPU."""
    from vllm.platforms import current_platform

    return current_platform.is_sleep_mode_available()


def remove_orphaned_versions(base: Path | None = None) -> list[Path]:
    """Remove the version directories a generator killed mid-load left in `base` (default
    versions_base()): a pod's /dev/shm outlives its container, and each is a model's size in
    memory. A directory is orphaned when the process named in it is gone, or when that process id
    is this process's own (a restarted container runs under the same id, and this engine has
    written nothing yet). Returns what was removed."""
    base = versions_base() if base is None else base
    removed = []
    for path in base.glob(f"{VERSIONS_PREFIX}*"):
        pid = path.name.removeprefix(VERSIONS_PREFIX).split("-", 1)[0]
        if not pid.isdigit():
            continue
        if int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
                continue  # alive: another generator's version, loading now
            except ProcessLookupError:
                pass
            except PermissionError:
                continue  # alive, another user's
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _cpu_threads_env(threads: int, tensor_parallel_size: int) -> None:
    """vLLM's CPU backend, left to itself, reserves a core and binds its OpenMP threads to the
    others: on a replica given one or two cores that halves it. In process (one worker, our
    default) nothing binds and the engine thread's own torch threads (streamrl.compute) run the
    model. A tensor-parallel replica's workers are processes of vLLM's: each binds to its share of
    the `threads` cores this process may run on, none reserved."""
    cores = sorted(os.sched_getaffinity(0))[:max(threads, tensor_parallel_size)]
    if len(cores) < tensor_parallel_size:
        raise ValueError(f"engine.tensorParallelSize {tensor_parallel_size}: on CPU each rank needs a core of its own; "
                         f"this replica may run on {len(cores)}")
    per_rank = len(cores) // tensor_parallel_size
    ranks = [cores[i * per_rank:(i + 1) * per_rank] for i in range(tensor_parallel_size)]
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, rank)) for rank in ranks)


@contextlib.contextmanager
def _threads_kept() -> Iterator[None]:
    """The calling thread's torch (OpenMP) thread count and torch.set_num_threads as they were
    before vLLM's code ran. vLLM's CPU worker replaces torch.set_num_threads with a no-op for the
    whole process (its OpenMP threads are bound in its worker processes); and its packing of small
    bfloat16 GEMM weights (sgl-kernel's convert_weight_packed, e.g. a small vocabulary's output
    head), at start-up and at every reload, leaves the calling thread at one OpenMP thread. In
    process nothing is bound and the engine thread runs the model with its own count
    (streamrl.compute): without this a bfloat16 replica given two cores decoded on one."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        if torch.get_num_threads() != threads:
            compute.restore_threads(threads)


def _kv_cache_reporter(engine: VllmEngine):
    """A vLLM stat logger (its public hook for per-step scheduler stats) that keeps the engine's
    `kv_cache_usage` current: vLLM's own fraction of KV blocks in use."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class KvCacheReporter(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                engine.kv_cache_usage = scheduler_stats.kv_cache_usage

        def log_engine_initialized(self):
            pass

    return KvCacheReporter


class VllmEngine(Engine):
    ptl_context = 16

    def __init__(self, spec: VllmEngineSpec, model_dir: str, dtype: str, eos_token_id: int | None, seed: int = 0,
                 weights: bool = True, threads: int = 1, colocated: bool = False):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core steps on our engine thread
        self.sleep_mode = colocated and sleep_mode_available()
        if colocated and not self.sleep_mode:
            log.warning("engine vllm on %s: vLLM has no sleep mode on this platform, so its KV cache (%s) stays "
                        "allocated while the colocated trainer trains", spec.device,
                        f"{spec.cpu_kv_cache_gib:g} GiB" if spec.device == "cpu"
                        else f"gpuMemoryUtilization {spec.gpu_memory_utilization:g}")
        kwargs = engine_kwargs(spec, model_dir, dtype, seed, weights, sleep_mode=self.sleep_mode)
        for path in remove_orphaned_versions():
            log.warning("removed %s: a version a killed generator was loading", path)
        kwargs["worker_extension_cls"] = VERSION_LOADER
        if spec.device == "cpu":
            _cpu_threads_env(threads, spec.tensor_parallel_size)
        from vllm import LLMEngine
        from vllm.engine.arg_utils import EngineArgs

        self.kv_cache_usage = 0.0
        with _threads_kept():
            self._llm = LLMEngine.from_engine_args(EngineArgs(**kwargs), stat_loggers=[_kv_cache_reporter(self)])
        self._workers_in_process = all(pid == os.getpid() for pid in self._llm.collective_rpc("process_id"))
        """vLLM's workers run in this process (one worker, the engine core in process): a version's
        tensors are handed to them as they are, with no files between."""
        self.capacity = spec.max_num_seqs
        self.batch_cap = spec.max_num_seqs
        self.eos_token_id = eos_token_id
        self.max_len = self._llm.model_config.max_model_len
        self._shapes = parameter_shapes(model_dir)
        self._waiting = WaitingRequests()
        self._running: dict[str, _RunningInVllm] = {}  # in vLLM: waiting there or decoding
        self._paused = False
        self._asleep = False
        self._admission_held = False
        self._pending: dict[str, torch.Tensor] = {}
        self.num_generated_tokens = 0
        self.policy_version = 0
        self.holds_weights = weights
        self.served_latency = ServedLatency()  # read by the agent's load reporter thread

    # ---- requests -------------------------------------------------------------------
    def add_request(self, request: GenerationRequest) -> None:
        need = len(request.prompt_token_ids) + request.max_new_tokens
        if need > self.max_len:
            raise ValueError(f"request {request.request_id}: prompt + max_new_tokens = {need} exceeds the context "
                             f"of {self.max_len} (engine.maxModelLen)")
        self._waiting.push(request)

    def abort(self, request_ids: Iterable[str]) -> None:
        ids = set(request_ids)
        self._waiting.remove(ids)
        inside = [rid for rid in ids if rid in self._running]
        if inside:
            self._llm.abort_request(inside)
            for rid in inside:
                del self._running[rid]

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def stats(self) -> EngineStats:
        return EngineStats(len(self._running), len(self._waiting), self.num_generated_tokens, self.batch_cap,
                           self.kv_cache_usage)

    def set_batch_cap(self, max_batch_size: int) -> None:
        self.batch_cap = min(max_batch_size, self.capacity) if max_batch_size > 0 else self.capacity

    def hold_admission(self, held: bool) -> None:
        """Held, no request of ours joins vLLM; those in it (decoding, or waiting inside it) go on."""
        self._admission_held = held

    # ---- the loop -------------------------------------------------------------------
    def step(self) -> list[Completion]:
        if self._paused:
            return []
        if self._waiting:
            self.wake_up()
        self._admit()
        if not self._running:
            return []
        batch_size = len(self._running)
        t0 = time.perf_counter()
        outputs = self._llm.step()
        finished = self._collect(outputs)
        self.served_latency.observe(batch_size, time.perf_counter() - t0)
        return finished

    def _admit(self) -> None:
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        now = time.monotonic()
        while self._waiting and len(self._running) < self.batch_cap and not self._admission_held:
            req, queued_at = self._waiting.pop()
            params = SamplingParams(
                temperature=req.temperature, top_p=req.top_p, max_tokens=req.max_new_tokens, seed=req.seed,
                logprobs=0, stop_token_ids=[] if self.eos_token_id is None else [self.eos_token_id],
                ignore_eos=True,  # vLLM knows no EOS without a tokenizer: stop_token_ids says it
                output_kind=RequestOutputKind.DELTA,
            )
            # The salt keeps a prompt's cached KV to the version that computed it.
            prompt = TokensPrompt(prompt_token_ids=list(req.prompt_token_ids),
                                  cache_salt=f"streamrl-v{self.policy_version}")
            self._llm.add_request(req.request_id, prompt, params, priority=-round(req.priority * PRIORITY_SCALE))
            self._running[req.request_id] = _RunningInVllm(req, now, now - queued_at)

    def _collect(self, outputs) -> list[Completion]:
        now = time.monotonic()
        finished = []
        for out in outputs:
            r = self._running.get(out.request_id)
            if r is None:
                continue  # aborted meanwhile
            done = out.outputs[0]
            r.tokens.extend(done.token_ids)
            r.versions.extend([self.policy_version] * len(done.token_ids))
            # logprobs=0: each position holds the sampled token's entry (processed_logprobs: after temperature).
            r.logprobs.extend(pos[tok].logprob for tok, pos in zip(done.token_ids, done.logprobs or ()))
            self.num_generated_tokens += len(done.token_ids)
            if out.finished:
                del self._running[out.request_id]
                stop = self.eos_token_id is not None and bool(r.tokens) and r.tokens[-1] == self.eos_token_id
                reason = "stop" if stop else "length"
                finished.append(Completion(r.request.request_id, tuple(r.tokens), tuple(r.logprobs), reason,
                                           r.versions[0] if r.versions else self.policy_version, r.queued_s,
                                           now - r.admitted_at, version_runs(r.versions)))
        return finished

    # ---- latency profile ------------------------------------------------------------
    def latency_profile(self) -> list[tuple[int, float]]:
        return self.served_latency.points()

    def measure_latency(self, batch_sizes: Iterable[int], steps: int = 4,
                        context: int | None = None) -> list[tuple[int, float]]:
        """At each batch size, `steps` of this engine's own steps (vLLM's scheduler iteration, the
        forward, sampling, our bookkeeping) over a steady batch of synthetic requests with
        `context` prompt tokens (default ptl_context), once every one has its first token (the
        prefill steps are untimed). They are aborted after; the engine is left as it was."""
        if self.has_unfinished():
            raise RuntimeError("measure_latency needs an idle engine")
        self.wake_up()
        context = self.ptl_context if context is None else context
        if not 1 <= context <= self.max_len - steps - 16:
            raise ValueError(f"measure_latency context {context}: must be 1..{self.max_len - steps - 16}")
        saved = self.eos_token_id, self.batch_cap, self.num_generated_tokens
        self.eos_token_id, self.batch_cap = None, self.capacity  # no EOS: each runs to its max_new_tokens
        prompt = tuple(4 + k % 16 for k in range(context))
        with self.served_latency.measuring(record=context == self.ptl_context) as out:
            try:
                for bs in sorted({min(b, self.capacity) for b in batch_sizes}):
                    ids = [f"measure-latency-{bs}-{i}" for i in range(bs)]
                    for i, rid in enumerate(ids):  # prompts differ in their last token: no prefix is shared
                        self.add_request(GenerationRequest(rid, (*prompt[:-1], 4 + i % 32), steps + 16, 1.0, 1.0,
                                                           seed=i))
                    while self._waiting or any(not self._running[rid].tokens for rid in ids):
                        self.step()
                        if any(rid not in self._running for rid in ids):  # one ended before all began
                            started = sum(1 for rid in ids if rid not in self._running or self._running[rid].tokens)
                            raise RuntimeError(
                                f"measure_latency at batch {bs}: vLLM decoded only {started} of its sequences at "
                                "once; its KV cache holds fewer than the pool's maxNumSeqs (raise cpuKvCacheGib, or "
                                "gpuMemoryUtilization)")
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        self.step()
                    out.append((bs, (time.perf_counter() - t0) / steps))
                    self.abort(ids)
            finally:
                self.abort(list(self._running) + self._waiting.request_ids())
                self.eos_token_id, self.batch_cap, self.num_generated_tokens = saved
        return out

    # ---- colocated: the device lent to the trainer --------------------------------------
    def sleep(self) -> bool:
        """vLLM's sleep (level 1: the KV cache discarded, the weights moved to host memory) where
        the platform has it (CUDA, ROCm, XPU), else nothing: the warning at start said so."""
        if self.has_unfinished():
            return False
        if self.sleep_mode and not self._asleep:
            self._llm.sleep(level=1)
            self._asleep = True
        return True

    def wake_up(self) -> None:
        if self._asleep:
            self._llm.wake_up()
            self._asleep = False

    # ---- weights: each version loaded in place ----------------------------------------------
    def pause_generation(self) -> None:
        self._paused = True

    def start_weight_update(self) -> None:
        if not self._paused:
            raise RuntimeError("start_weight_update needs pause_generation first")
        self.wake_up()  # the weights go back to the device before a version loads into them
        self._pending = {}

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            shape = self._shapes.get(name)
            if shape is None:
                raise ValueError(f"weight update names an unknown parameter {name!r}")
            if tuple(tensor.shape) != shape:
                raise ValueError(f"weight {name}: shape {tuple(tensor.shape)} != {shape}")
            self._pending[name] = tensor.detach().to("cpu").contiguous()

    def finish_weight_update(self, policy_version: int) -> None:
        """Refuse a version that lacks a parameter (the engine keeps the one it holds), else load it
        in place: handed to vLLM's worker as it is where the worker runs in this process (one
        worker, our default), else written once as a safetensors directory, visible by rename once
        complete, that each worker process reads (removed once loaded: vLLM keeps no reference to
        the files; what a process killed mid-load leaves behind, the next engine on this storage
        removes: remove_orphaned_versions). The prefix cache forgets the older KV (requests running
        through the load, an in-flight update, keep theirs: their next tokens come from the new
        weights). Under vLLM's async scheduling (off on CPU) a step may return a token the batch
        before the load sampled: version_runs could then place the switch a token late."""
        tensors, self._pending = self._pending, {}
        missing = sorted(set(self._shapes) - set(tensors))
        if missing:
            raise ValueError(f"weight update for version {policy_version} lacks {len(missing)} parameter(s): "
                             f"{', '.join(missing[:3])}{'...' if len(missing) > 3 else ''}; it is not loaded")
        with _threads_kept():  # the reload repacks weights as the start did
            if self._workers_in_process:
                loaded = self._llm.collective_rpc("load_tensors", args=(tensors,))
            else:
                loaded = self._load_through_files(tensors, policy_version)
        for names in loaded:
            if set(names) != set(tensors):
                raise RuntimeError(f"version {policy_version}: vLLM's worker loaded {len(set(names))} of "
                                   f"{len(tensors)} tensors")
        if not self._running:  # vLLM resets only a cache no request holds; the salt keeps versions apart anyway
            self._llm.reset_prefix_cache()
        self.policy_version = policy_version

    def _load_through_files(self, tensors: dict[str, torch.Tensor], policy_version: int) -> list[list[str]]:
        from safetensors.torch import save_file

        root = Path(tempfile.mkdtemp(prefix=f"{VERSIONS_PREFIX}{os.getpid()}-v{policy_version}-", dir=versions_base()))
        try:
            partial, path = root / "partial", root / f"v{policy_version}"
            partial.mkdir()
            save_file(tensors, str(partial / "model.safetensors"))
            os.rename(partial, path)
            return self._llm.collective_rpc("load_version", args=(str(path),))
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def resume_generation(self) -> None:
        self._paused = False
