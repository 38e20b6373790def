"""The inference-engine interface the generator agent drives, and its factory.

An engine knows token ids only: no prompts as text, no gRPC, no trainer. The weight-update
path has vLLM's shape (pause -> start -> update chunks -> finish(version) -> resume) so a
vLLM-backed engine implements the same interface.
"""

from __future__ import annotations

import heapq
import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamrl.rollout.work import admission_key
from streamrl.samples import VersionRun

if TYPE_CHECKING:
    import torch

    from streamrl.spec import EngineSpec


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    """Unique id; the agent uses "<prompt_id>/<sample_index>"."""
    prompt_token_ids: tuple[int, ...]
    """[P] prompt token ids, BOS included."""
    max_new_tokens: int
    """Cap on generated tokens."""
    temperature: float = 1.0
    """0 = greedy."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]."""
    seed: int = 0
    """Seed of this request's own random stream (reproducible wherever it runs)."""
    priority: float = 0.0
    """Higher is admitted first; ties are first-come first-served."""


@dataclass(frozen=True)
class Completion:
    request_id: str
    token_ids: tuple[int, ...]
    """[C] generated token ids (EOS included when produced)."""
    logprobs: tuple[float, ...]
    """[C] log-probabilities of the sampled tokens at the sampling temperature, before top-p."""
    finish_reason: str
    """"stop" (EOS) or "length" (max_new_tokens)."""
    policy_version: int
    """Weight version that produced the first (oldest) token."""
    queue_s: float
    """Seconds from add_request to admission into the running batch."""
    generate_s: float
    """Seconds from admission to the last token."""
    version_runs: tuple[VersionRun, ...] = ()
    """The versions of its tokens, run-length (samples.version_runs); () when all are policy_version's."""


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_generated_tokens: int
    """Since the engine started."""
    capacity: int
    """Maximum running sequences."""
    kv_cache_usage: float = 0.0
    """Fraction of the KV cache in use, 0-1, as of the last step."""


class WaitingRequests:
    """An engine's requests not yet decoding: highest priority first, then arrival
    (work.admission_key), each with when it was queued (monotonic seconds)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, GenerationRequest, float]] = []
        self._arrival = itertools.count()

    def push(self, request: GenerationRequest) -> None:
        heapq.heappush(self._heap, (*admission_key(request.priority, next(self._arrival)), request, time.monotonic()))

    def pop(self) -> tuple[GenerationRequest, float]:
        """The next request to admit, and when it was queued."""
        _, _, request, queued_at = heapq.heappop(self._heap)
        return request, queued_at

    def remove(self, request_ids: set[str]) -> None:
        self._heap = [w for w in self._heap if w[2].request_id not in request_ids]
        heapq.heapify(self._heap)

    def request_ids(self) -> list[str]:
        return [w[2].request_id for w in self._heap]

    def __len__(self) -> int:
        return len(self._heap)


class Engine(ABC):
    """A continuous-batching generator of completions, stepped by its owner's thread."""

    policy_version: int = 0
    holds_weights: bool = True
    """False while a replica that booted from the trainer holds no version yet (its weights are
    zeros: it takes no work until the first version loads)."""
    ptl_context: int = 0
    """Prompt tokens of each sequence measure_latency decodes (its context, plus the few generated)."""

    @abstractmethod
    def add_request(self, request: GenerationRequest) -> None:
        """Queue a request; it joins the running batch at a later step."""

    @abstractmethod
    def abort(self, request_ids: Iterable[str]) -> None:
        """Drop these requests, waiting or running; unknown ids are ignored."""

    @abstractmethod
    def step(self) -> list[Completion]:
        """Admit waiting requests, decode one token for every running one, and return
        the requests that finished. Does nothing while paused."""

    @abstractmethod
    def has_unfinished(self) -> bool:
        """True while any request waits or runs."""

    @abstractmethod
    def stats(self) -> EngineStats: ...

    @abstractmethod
    def hold_admission(self, held: bool) -> None:
        """While held, waiting requests stay waiting: step() decodes the running ones only (a
        replica draining them before it loads a version)."""

    @abstractmethod
    def set_batch_cap(self, max_batch_size: int) -> None:
        """Decode at most this many sequences at once from now on (0 = full capacity);
        running sequences above the cap finish, new ones wait."""

    @abstractmethod
    def measure_latency(self, batch_sizes: Iterable[int], steps: int = 4,
                        context: int | None = None) -> list[tuple[int, float]]:
        """PTL(BS): seconds per decode step at each batch size, measured now (call while idle):
        the engine's whole step as step() runs it (inputs, forward, sampling, bookkeeping), not
        the forward alone, with sequences of `context` tokens (default ptl_context: then the
        profile the replica reports). What a replica measures at start-up and `streamrl profile` records."""

    @abstractmethod
    def latency_profile(self) -> list[tuple[int, float]]:
        """PTL(BS) as seen in recent decode steps (smoothed), plus measured points not seen since."""

    # Weight updates, in this order, between two steps. Running requests keep their KV cache and
    # go on with the new version: each token's version is in its Completion's version_runs.
    @abstractmethod
    def pause_generation(self) -> None: ...

    @abstractmethod
    def start_weight_update(self) -> None: ...

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors (names as in the policy's named_parameters) into the engine."""

    @abstractmethod
    def finish_weight_update(self, policy_version: int) -> None:
        """All tensors are in; from now on new tokens come from `policy_version`."""

    @abstractmethod
    def resume_generation(self) -> None: ...

    # Colocated mode: the device is the trainer's between generating (vLLM's sleep mode).
    def sleep(self) -> bool:
        """Let go of the memory an idle engine holds beside its weights (the KV cache) while a
        colocated trainer trains; the next step with work, or measure_latency, takes it back.
        Returns False, releasing nothing, while any request waits or runs. An engine with no
        memory of its own to release (the default) has nothing to do."""
        return not self.has_unfinished()

    def wake_up(self) -> None:  # noqa: B027 (optional: an engine that releases nothing takes nothing back)
        """Take back what sleep() let go of (nothing to do by default, or when awake)."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        """The whole update sequence at once."""
        self.pause_generation()
        self.start_weight_update()
        self.update_weights(named_tensors)
        self.finish_weight_update(policy_version)
        self.holds_weights = True
        self.resume_generation()


def setup_engine(spec: EngineSpec, model_dir: str, dtype: str, eos_token_id: int | None, seed: int = 0,
                 weights: bool = True, threads: int = 1, colocated: bool = False) -> Engine:
    """Build the engine a pool's spec names; without `weights`, from the directory's config
    alone (a replica booting from the trainer: holds_weights stays False until a version loads).
    `eos_token_id` None: no token ends a sequence, each runs to its max_new_tokens (benchmarks).
    `threads`: the cores the pool gives each replica (vLLM's CPU backend binds to them).
    `colocated`: it shares its device with a trainer (sleep() then releases what it can)."""
    if spec.type == "torch":
        from streamrl.generator.torch_engine import TorchEngine
        from streamrl.models import load_model, model_from_config

        build = load_model if weights else model_from_config
        engine = TorchEngine(build(model_dir, dtype=dtype, device=spec.device), max_batch_size=spec.max_batch_size,
                             eos_token_id=eos_token_id)
        engine.holds_weights = weights
        return engine
    if spec.type == "vllm":
        from streamrl.generator.vllm_engine import VllmEngine

        return VllmEngine(spec, model_dir, dtype, eos_token_id, seed=seed, weights=weights, threads=threads,
                          colocated=colocated)
    raise ValueError(f"engine.type {spec.type!r}: unknown engine")
