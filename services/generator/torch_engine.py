"""Pure-torch continuous-batching engine: requests join and leave the running batch every step.

Runs on any torch device. Admission is by priority (then arrival); each request samples
from its own seeded random stream, so a sample is reproducible whichever batch it ran in.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from streamrl.generator.decoder import SlotDecoder
from streamrl.generator.engine import Completion, Engine, EngineStats, GenerationRequest, WaitingRequests
from streamrl.latency import ServedLatency
from streamrl.samples import version_runs


@dataclass
class _RunningInSlot:
    request: GenerationRequest
    rng: torch.Generator
    admitted_at: float
    queued_s: float
    next_token: int = -1
    """Sampled but not yet in the KV cache."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """The weight version that sampled each token."""

    @property
    def cache_len(self) -> int:
        return len(self.request.prompt_token_ids) + len(self.tokens) - 1


class TorchEngine(Engine):
    ptl_context = 16

    def __init__(self, model: torch.nn.Module, max_batch_size: int, eos_token_id: int | None,
                 max_len: int | None = None):
        self.model = model
        self.capacity = max_batch_size
        self.batch_cap = max_batch_size
        self.eos_token_id = eos_token_id
        hf: Any = model  # read by its Hugging Face attribute names (torch types those Tensor | Module)
        max_len = max_len or int(getattr(hf.config, "max_position_embeddings", 2048))
        self.decoder = SlotDecoder(model, max_batch_size, min(max_len, 8192))
        self.device = hf.lm_head.weight.device
        self._params = dict(model.named_parameters())
        self._waiting = WaitingRequests()
        self._running: list[_RunningInSlot] = []  # index = slot
        self._paused = False
        self._admission_held = False
        self._updated: set[str] = set()
        self.num_generated_tokens = 0
        self.policy_version = 0
        self.served_latency = ServedLatency()  # read by the agent's load reporter thread

    # ---- requests -------------------------------------------------------------------
    def add_request(self, request: GenerationRequest) -> None:
        need = len(request.prompt_token_ids) + request.max_new_tokens
        if need > self.decoder.max_len:
            raise ValueError(
                f"request {request.request_id}: prompt + max_new_tokens = {need} exceeds the context of "
                f"{self.decoder.max_len}"
            )
        self._waiting.push(request)

    def abort(self, request_ids: Iterable[str]) -> None:
        ids = set(request_ids)
        self._waiting.remove(ids)
        for slot in reversed(range(len(self._running))):
            if self._running[slot].request.request_id in ids:
                self._remove(slot)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def stats(self) -> EngineStats:
        cached = sum(r.cache_len for r in self._running)
        return EngineStats(len(self._running), len(self._waiting), self.num_generated_tokens, self.batch_cap,
                           cached / (self.capacity * self.decoder.max_len))

    # ---- the loop -------------------------------------------------------------------
    def step(self) -> list[Completion]:
        if self._paused:
            return []
        if self.decoder.released:
            if not self._waiting:
                return []
            self.wake_up()
        finished: list[Completion] = []
        self._admit(finished)
        if self._running:
            # The whole decode step is timed (its inputs, the forward, sampling, the per-sequence
            # bookkeeping), as measure_latency times it: PTL is what a step costs, not the forward alone.
            t0 = time.perf_counter()
            slots = self._running
            batch_size = len(slots)  # before sampling removes the finished ones from it
            tokens = torch.tensor([r.next_token for r in slots], device=self.device)
            positions = torch.tensor([r.cache_len for r in slots], device=self.device)
            logits = self.decoder.decode(tokens, positions)
            self._sample(list(range(batch_size)), logits, finished)
            self.served_latency.observe(batch_size, time.perf_counter() - t0)
        return finished

    # ---- latency profile ------------------------------------------------------------
    def latency_profile(self) -> list[tuple[int, float]]:
        return self.served_latency.points()

    def measure_latency(self, batch_sizes: Iterable[int], steps: int = 4,
                        context: int | None = None) -> list[tuple[int, float]]:
        """At each batch size, `steps` of this engine's own decode steps (step(): inputs, the
        forward, sampling at temperature 1 from each request's stream, the per-sequence
        bookkeeping) over a steady batch of synthetic requests with `context` prompt tokens
        (default ptl_context), after one untimed step that admits them (prefill) and warms up.
        They are aborted after; the engine is left as it was (its token count, EOS, batch cap)."""
        if self._running or self._waiting:
            raise RuntimeError("measure_latency needs an idle engine (it borrows the cache slots)")
        self.wake_up()
        context = self.ptl_context if context is None else context
        if not 1 <= context <= self.decoder.max_len - steps - 3:
            raise ValueError(f"measure_latency context {context}: must be 1..{self.decoder.max_len - steps - 3}")
        saved = self.eos_token_id, self.batch_cap, self.num_generated_tokens
        self.eos_token_id = None  # no EOS: every synthetic request runs to its max_new_tokens
        self.batch_cap = self.capacity
        prompt = tuple(4 + k % 16 for k in range(context))  # ordinary ids of any vocabulary
        with self.served_latency.measuring(record=context == self.ptl_context) as out:
            try:
                for bs in sorted({min(b, self.capacity) for b in batch_sizes}):
                    ids = [f"measure-latency-{bs}-{i}" for i in range(bs)]
                    for i, rid in enumerate(ids):  # steps + 3 tokens: none finishes inside the timed steps
                        self.add_request(GenerationRequest(rid, prompt, steps + 3, 1.0, 1.0, seed=i))
                    self.step()
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        self.step()
                    seconds = (time.perf_counter() - t0) / steps
                    self.abort(ids)
                    out.append((bs, seconds))
            finally:
                self.abort([r.request.request_id for r in self._running])
                self.eos_token_id, self.batch_cap, self.num_generated_tokens = saved
        return out

    def set_batch_cap(self, max_batch_size: int) -> None:
        self.batch_cap = min(max_batch_size, self.capacity) if max_batch_size > 0 else self.capacity

    def hold_admission(self, held: bool) -> None:
        self._admission_held = held

    def _admit(self, finished: list[Completion]) -> None:
        free = self.batch_cap - len(self._running)
        if free <= 0 or not self._waiting or self._admission_held:
            return
        now = time.monotonic()
        new = []
        while self._waiting and len(new) < free:
            req, queued_at = self._waiting.pop()
            rng = torch.Generator(device="cpu")
            rng.manual_seed(req.seed)
            new.append(_RunningInSlot(req, rng, now, now - queued_at))
        first = len(self._running)
        self._running.extend(new)
        logits = self.decoder.prefill(first, [list(r.request.prompt_token_ids) for r in new])
        self._sample(list(range(first, first + len(new))), logits, finished)

    def _sample(self, slots: list[int], logits: torch.Tensor, finished: list[Completion]) -> None:
        """Sample one token per slot from [len(slots), V] logits; retire finished slots."""
        reqs = [self._running[s] for s in slots]
        temps = torch.tensor([r.request.temperature or 1.0 for r in reqs], device=logits.device)
        logp = torch.log_softmax(logits / temps[:, None], dim=-1)
        greedy = [r.request.temperature == 0 for r in reqs]
        if all(greedy):
            chosen = logp.argmax(-1)
        else:
            probs = logp.exp()
            top_ps = torch.tensor([r.request.top_p for r in reqs], device=logits.device)
            if bool((top_ps < 1).any()):
                sorted_p, order = probs.sort(-1, descending=True)
                drop = (sorted_p.cumsum(-1) - sorted_p) > top_ps[:, None]
                probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
            # Exponential race = a categorical draw, with each request's own stream.
            noise = torch.stack([torch.empty(probs.shape[-1]).exponential_(generator=r.rng) for r in reqs])
            chosen = (probs / noise.to(probs.device)).argmax(-1)
            if any(greedy):
                chosen = torch.where(torch.tensor(greedy, device=chosen.device), logp.argmax(-1), chosen)
        chosen_logp = logp.gather(-1, chosen[:, None])[:, 0]
        now = time.monotonic()
        done = []
        for slot, r, tok, lp in zip(slots, reqs, chosen.tolist(), chosen_logp.tolist()):
            r.tokens.append(tok)
            r.logprobs.append(lp)
            r.versions.append(self.policy_version)
            r.next_token = tok
            self.num_generated_tokens += 1
            if tok == self.eos_token_id or len(r.tokens) >= r.request.max_new_tokens:
                reason = "stop" if tok == self.eos_token_id else "length"
                finished.append(
                    Completion(
                        r.request.request_id, tuple(r.tokens), tuple(r.logprobs), reason,
                        r.versions[0], r.queued_s, now - r.admitted_at, version_runs(r.versions),
                    )
                )
                done.append(slot)
        for slot in sorted(done, reverse=True):
            self._remove(slot)

    def _remove(self, slot: int) -> None:
        """Retire a slot, moving the last running sequence into it to keep slots dense."""
        last = len(self._running) - 1
        if slot != last:
            moved = self._running[last]
            self.decoder.move_slot(last, slot, moved.cache_len)
            self._running[slot] = moved
        self._running.pop()

    # ---- colocated: the KV cache lent back to the trainer ------------------------------
    def sleep(self) -> bool:
        if self.has_unfinished():
            return False
        self.decoder.release()
        return True

    def wake_up(self) -> None:
        """The KV cache allocated again, if asleep."""
        if self.decoder.released:
            self.decoder.allocate()

    # ---- weights (vLLM-shaped) ------------------------------------------------------
    def pause_generation(self) -> None:
        self._paused = True

    def start_weight_update(self) -> None:
        if not self._paused:
            raise RuntimeError("start_weight_update needs pause_generation first")
        self._updated = set()

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            param = self._params.get(name)
            if param is None:
                raise ValueError(f"weight update names an unknown parameter {name!r}")
            if param.shape != tensor.shape:
                raise ValueError(f"weight {name}: shape {tuple(tensor.shape)} != {tuple(param.shape)}")
            param.copy_(tensor)
            self._updated.add(name)

    def finish_weight_update(self, policy_version: int) -> None:
        missing = set(self._params) - self._updated
        if missing:
            raise ValueError(f"weight update for version {policy_version} lacks {sorted(missing)[:3]}...")
        self.policy_version = policy_version

    def resume_generation(self) -> None:
        self._paused = False
