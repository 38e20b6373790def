"""The trainer and the ranker: where they run and how they serve."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, ValidationInfo, field_validator, model_validator

from streamrl.spec.base import SpecModel
from streamrl.spec.generators import PlacementSpec


class TrainerServiceSpec(SpecModel):
    """Kubernetes: the trainer's gRPC Service as other clusters reach it (serviceType NodePort or
    LoadBalancer). Its admin port is never on it (a ClusterIP Service of its own)."""

    annotations: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Annotations of the Service, e.g. an internal load balancer
    (`networking.gke.io/load-balancer-type: Internal`, `service.beta.kubernetes.io/aws-load-balancer-scheme:
    internal`)."""
    load_balancer_source_ranges: list[str] = Field(default_factory=list, max_length=64)
    """CIDRs the cloud load balancer lets through (e.g. the other datacenter's egress
    addresses); empty = any. Enforced by the load balancer, not by the job's NetworkPolicy:
    behind a proxying one (AWS's Classic ELB, an NLB with IP targets and no client-IP
    preservation) the trainer sees the balancer's own addresses (see allowFrom)."""
    allow_from: list[str] = Field(default_factory=list, max_length=64)
    """CIDRs the job's NetworkPolicy admits to the exposed gRPC port (NodePort or
    LoadBalancer); empty = any (the port still needs the job's token and TLS). Where the
    client's address reaches the pod (GKE, an NLB preserving client IPs) this can repeat
    loadBalancerSourceRanges; behind a proxying balancer it must include the balancer's
    addresses (the VPC's CIDR), or traffic and health checks are dropped."""
    load_balancer_class: str | None = Field(default=None, max_length=253)
    """The load balancer implementation (spec.loadBalancerClass), unset = the cluster's default."""


class TrainerMemorySpec(SpecModel):
    """What the trainer trades for memory, each from torch itself; neither changes what it
    learns (the parameters after each step are the same with and without)."""

    activation_checkpointing: StrictBool = False
    """Keep only each decoder layer's input in the forward pass and recompute the layer's
    activations in the backward pass (torch.utils.checkpoint, non-reentrant): activation
    memory of one layer at a time instead of all of them, for about one more forward pass."""
    cpu_offload: StrictBool = False
    """FSDP2's CPUOffloadPolicy: the sharded parameters, their gradients and the optimizer
    state live in host memory and the optimizer steps there; each layer's parameters are
    copied to the device for its forward and backward. Needs the trainer sharded over two
    ranks or more (FSDP2 over a process group)."""
    tensor_parallel: int = Field(default=1, ge=1, le=8)
    """Ranks each decoder layer is split across (DTensor tensor parallelism: attention heads
    and MLP columns, `parallelize_module`), within a node; the world size over it shards
    data-parallel with FSDP2 on a 2-D mesh. Each rank then holds 1/tensorParallel of a layer's
    weights and activations. Must divide processesPerNode, and the model's attention heads, KV
    heads and MLP width."""


class TrainerStartupSpec(SpecModel):
    """How long each step of a trainer's start may take before the trainer gives up on it
    (exits non-zero, naming the step and this field). Each bounds one step, not the whole
    start: a group waiting for its last node, a large model read from network storage and a
    large checkpoint resume each get their own time."""

    rendezvous_seconds: int = Field(default=1800, ge=30, le=86400)
    """Kubernetes, a trainer of several processes: how long its processes wait for every
    other one to join the group (torch.distributed.run's rendezvous timeout), e.g. for the
    last node to be provisioned and pull its image. The pod's startup probe covers this and a
    margin; past it, the group fails."""
    load_seconds: int = Field(default=1800, ge=10, le=86400)
    """Loading the model and tokenizer onto the device (and, colocated, the in-process
    generator's engine), from the start of the process's admin server."""
    resume_seconds: int = Field(default=3600, ge=10, le=86400)
    """Loading the newest checkpoint (model, optimizer state, the run's ledger) when a start
    resumes a run."""


class TrainerSpec(SpecModel):
    """Training side."""

    device: str = Field(default="cpu", max_length=64)
    """torch device of the learner (`cuda` on GPU pools: each rank takes the GPU of its local rank)."""
    threads: int = Field(default=1, ge=1)
    """torch threads of each trainer rank, for its learner's thread (streamrl.compute)."""
    nodes: int = Field(default=1, ge=1, le=1024)
    """Kubernetes: trainer pods (an Indexed Job, one pod per node); locally, 1."""
    restart_limit: int | None = Field(default=None, ge=0, le=100)
    """Restarts of a failed trainer (on Kubernetes, of its whole group) before the run fails;
    each resumes from the newest checkpoint. Unset = the operator's STREAMRL_TRAINER_BACKOFF_LIMIT
    on Kubernetes, 3 for `streamrl run`."""
    preemption_limit: int = Field(default=10, ge=0, le=1000)
    """Kubernetes: group restarts after a preemption (the trainer saved and exited on SIGTERM,
    a pod was evicted through the API or preempted by the scheduler, a suspension) that are not
    counted against restart_limit; past this many, each counts. Evictions by the kubelet for
    node pressure or a volume over its size always count: retried, they tend to repeat."""
    process_group_timeout_seconds: int = Field(default=300, ge=10, le=86400)
    """How long a collective may wait for every rank: a rank that died fails the others
    within this, instead of leaving them waiting forever."""
    port: int = Field(default=0, ge=0, le=65535)
    """gRPC port generators dial (0 = any free port; local runs)."""
    admin_port: int = Field(default=0, ge=0, le=65535)
    """HTTP admin port (/healthz, /readyz, /metrics, /status; 0 = any free port)."""
    min_generators: int = Field(default=1, ge=1)
    """Generators that must be connected before the first iteration starts."""
    keep_versions: int = Field(default=2, ge=1)
    """Weight versions kept in memory for generators to fetch."""
    weight_chunk_bytes: int = Field(default=1 << 20, ge=1024, le=3 << 20)
    """Size of one FetchWeights chunk, bytes (below gRPC's 4 MiB message limit)."""
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    """Kubernetes: node pool, tolerations, GPUs and pod template of the trainer."""
    processes_per_node: int = Field(default=1, ge=1, le=64)
    """Trainer ranks per pod (on GPU pools, its GPUs). World size = nodes x processesPerNode;
    the model, its gradients and optimizer state are sharded over all ranks (FSDP2)."""
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    """Kubernetes Service type of the trainer's gRPC endpoint; pools in other clusters
    need `NodePort` or `LoadBalancer`."""
    external_host: str | None = Field(default=None, max_length=253)
    """With `NodePort`: the host other clusters reach this cluster's nodes at (a node's
    address, or a gateway in front of them); they dial it on the Service's node port."""
    service: TrainerServiceSpec = Field(default_factory=TrainerServiceSpec)
    """Kubernetes: annotations, source ranges and class of the trainer's Service."""
    memory: TrainerMemorySpec = Field(default_factory=TrainerMemorySpec)
    """Activation checkpointing and CPU offload of the sharded model."""
    startup: TrainerStartupSpec = Field(default_factory=TrainerStartupSpec)
    """Bounds of the start's steps: rendezvous, model load, checkpoint resume."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node

    @model_validator(mode="after")
    def _offload_shards(self) -> TrainerSpec:
        if self.memory.cpu_offload and self.world_size < 2:
            raise ValueError("memory.cpuOffload: needs the trainer sharded over two ranks or more (nodes x "
                             f"processesPerNode is {self.world_size}); FSDP2 offloads the shards of a process group")
        tp = self.memory.tensor_parallel
        if tp > 1 and self.processes_per_node % tp:
            raise ValueError(f"memory.tensorParallel: {tp} must divide processesPerNode ({self.processes_per_node}): "
                             "a layer is split across the ranks of one node")
        return self

    @field_validator("processes_per_node")
    @classmethod
    def _a_gpu_per_rank(cls, value: int, info: ValidationInfo) -> int:
        placement, device = info.data.get("placement"), info.data.get("device", "")
        if placement is not None and device.startswith("cuda") and value > placement.gpus:
            raise ValueError(f"{value} is more than the GPUs of a trainer pod (placement.gpus: {placement.gpus}): "
                             "on a CUDA trainer each rank needs a GPU")
        return value


class RankerSpec(SpecModel):
    """The output-length ranker service."""

    predictor: Literal["features", "causal-lm"] = "features"
    """`features`: ridge regression on prompt n-grams and numbers, learnt online (CPU,
    milliseconds). `causal-lm`: a small causal LM (modelPath) fine-tuned online with a
    ranking objective; the heavier option, for a GPU."""
    model_path: str | None = None
    """Hugging Face model directory of the `causal-lm` predictor."""
    device: str = Field(default="cpu", max_length=64)
    """torch device of the `causal-lm` predictor (e.g. `cuda`)."""
    state_path: str | None = None
    """File the ranker saves its state to and restores it from (local runs default to
    <out>/ranker.npz)."""
    window: int = Field(default=512, ge=10)
    """Observations over which the ranker reports its own recall."""
    min_observations: int = Field(default=32, ge=1)
    """Observations before the learned predictor is trusted (history and the mean before)."""
    port: int = Field(default=0, ge=0, le=65535)
    """gRPC port (0 = any free port; local runs)."""
    admin_port: int = Field(default=0, ge=0, le=65535)
    """HTTP admin port (0 = any free port)."""
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    """Kubernetes: node pool, tolerations, GPUs and pod template of the ranker."""

    @model_validator(mode="after")
    def _lm_needs_model(self) -> RankerSpec:
        if self.predictor == "causal-lm" and not self.model_path:
            raise ValueError("modelPath is required when predictor is 'causal-lm'")
        return self
