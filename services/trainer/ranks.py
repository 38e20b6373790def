"""The trainer as a group of ranks on torch.distributed, launched the way torchrun launches
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the environment; none: world size 1).
The policy is sharded over every rank with FSDP2; rank 0 leads: it sends each rank its
share of the work and the commands that close an iteration (the control messages travel on
a gloo group of their own, whatever the training backend). World size 1 is the same code:
sharding over one rank is the unsharded model, and a command is a local call.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist

from streamrl.trainer.commands import Command, CommandT

log = logging.getLogger(__name__)


@dataclass
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    control: Any = None
    """The gloo group control messages travel on (None at world size 1)."""
    checkpoints: Any = None
    """The gloo group asynchronous checkpoint saves coordinate on, in their own thread, beside
    training's collectives (None at world size 1)."""
    meshes: dict[tuple[str, int], Any] = field(default_factory=dict, repr=False, compare=False)
    """The 2-D (data-parallel, tensor-parallel) device meshes made so far, by device type and
    tensor-parallel size: the policy, the reference and the critic share one."""

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def tensor_parallel_mesh(self, tp: int, device_type: str):
        """The (world / tp, tp) mesh, its dimensions named `dp` and `tp`, made on first use (a
        collective: every rank asks in the same order)."""
        key = (device_type, tp)
        if key not in self.meshes:
            from torch.distributed.device_mesh import init_device_mesh

            self.meshes[key] = init_device_mesh(device_type, (self.world_size // tp, tp), mesh_dim_names=("dp", "tp"))
        return self.meshes[key]

    @classmethod
    def from_environment(cls, device: str = "cpu", timeout_s: float = 300.0) -> Ranks:
        """Join the process group torchrun's environment describes; world size 1 without one.
        A rank that dies makes every collective of the others fail within `timeout_s`."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size == 1:
            return cls()
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        backend = "gloo"
        if device.startswith("cuda"):
            torch.cuda.set_device(local_rank)
            backend = "nccl"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        control = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        checkpoints = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        log.info("rank %d of %d (local rank %d) joined the %s group", rank, world_size, local_rank, backend)
        return cls(rank, world_size, local_rank, control, checkpoints)

    def device(self, device: str) -> str:
        """The device of this rank: its local GPU on CUDA."""
        return f"cuda:{self.local_rank}" if device == "cuda" else device

    def send(self, per_rank: list[CommandT]) -> CommandT:
        """Leader: hand per_rank[r] to rank r; returns this rank's own."""
        assert self.is_leader and len(per_rank) == self.world_size
        if self.world_size == 1:
            return per_rank[0]
        received: list[Any] = [None]
        dist.scatter_object_list(received, per_rank, src=0, group=self.control)
        return received[0]

    def receive(self) -> Command:
        """Another rank: what the leader handed it next."""
        received: list[Any] = [None]
        dist.scatter_object_list(received, None, src=0, group=self.control)
        return received[0]

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over every rank."""
        if self.world_size == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=self.control)
        return t.tolist()

    def maximum(self, value: float) -> float:
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return float(t[0])

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


TENSOR_PARALLEL_PLAN = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
                        "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
                        "mlp.down_proj": "rowwise"}
"""A Llama-family decoder layer split Megatron-style: the attention's heads and the MLP's
columns column-wise, their output projections row-wise (one all-reduce after each)."""


def shard(model: torch.nn.Module, ranks: Ranks, dtype: str = "float32", cpu_offload: bool = False,
          tensor_parallel: int = 1) -> torch.nn.Module:
    """FSDP2 over every rank: each decoder layer a unit, then the root (the embeddings and the
    head); on CUDA, compute in the spec's dtype and reduce in float32; with `cpu_offload`, the
    shards, their gradients and the optimizer state in host memory (CPUOffloadPolicy). With
    `tensor_parallel` > 1, each layer is first split across groups of that many consecutive
    ranks (TENSOR_PARALLEL_PLAN) and FSDP2 shards over the other dimension of the 2-D mesh.
    One rank: unchanged."""
    if ranks.world_size % tensor_parallel:
        raise ValueError(f"trainer.memory.tensorParallel: {tensor_parallel} does not divide the trainer's "
                         f"{ranks.world_size} ranks")
    if ranks.world_size == 1:
        if cpu_offload:
            raise ValueError("trainer.memory.cpuOffload needs the trainer sharded over two ranks or more")
        return model
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs = {}
    on_gpu = next(model.parameters()).is_cuda
    if tensor_parallel > 1:
        kwargs["mesh"] = _split_layers(model, ranks, tensor_parallel, "cuda" if on_gpu else "cpu")
    if on_gpu and dtype != "float32":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=getattr(torch, dtype), reduce_dtype=torch.float32)
    if cpu_offload:  # pinned host memory for the copies to a GPU (a CPU build has none to pin)
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=on_gpu)
    for layer in _layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _split_layers(model: torch.nn.Module, ranks: Ranks, tp: int, device_type: str):
    """Split every decoder layer over the `tp` ranks of its row of a (world / tp, tp) mesh;
    returns the data-parallel dimension, for FSDP2. ValueError naming what does not divide."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    cfg = getattr(model, "config", None) or getattr(getattr(model, "model", None), "config", None)
    sizes = {"num_attention_heads": getattr(cfg, "num_attention_heads", None),
             "num_key_value_heads": getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_attention_heads",
                                                                                         None),
             "intermediate_size": getattr(cfg, "intermediate_size", None)}
    for name, n in sizes.items():
        if n is None or n % tp:
            raise ValueError(f"trainer.memory.tensorParallel: {tp} does not divide the model's {name} ({n})")
    layers = _layers(model)

    def lacks(path: str) -> bool:
        try:
            layers[0].get_submodule(path)
        except AttributeError:
            return True
        return False

    missing = [path for path in TENSOR_PARALLEL_PLAN if layers and lacks(path)]
    if not layers or missing:
        raise ValueError(f"trainer.memory.tensorParallel: {type(model).__name__}'s layers lack {missing or 'layers'}")
    mesh = ranks.tensor_parallel_mesh(tp, device_type)
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for layer in layers:
        parallelize_module(layer, mesh["tp"], {path: styles[style]() for path, style in TENSOR_PARALLEL_PLAN.items()})
    return mesh["dp"]


def clip_grad_norm(parameters, max_norm: float) -> float:
    """torch's gradient clipping (get_total_norm, clip_grads_with_norm_) over parameters that
    may live on different device meshes (tensor-parallel layers on the 2-D mesh, the rest on
    FSDP's): each mesh's norm is taken on its own and put together whole; returns the norm of
    every gradient before clipping."""
    groups: dict[object, list[torch.nn.Parameter]] = {}
    for p in parameters:
        if p.grad is not None:
            groups.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    if not groups:
        return 0.0
    norms = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group if p.grad is not None])
        full_tensor = getattr(norm, "full_tensor", None)  # a DTensor's (a mesh's) norm
        norms.append(full_tensor() if full_tensor is not None else norm)
    total = torch.linalg.vector_norm(torch.stack(norms))
    for group in groups.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return float(total)


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (torch.utils.checkpoint,
    non-reentrant, through the model's own per-layer hook: parameter names are unchanged, so
    checkpoints and published weights are those of the plain model)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"trainer.memory.activationCheckpointing: {type(model).__name__} does not support it")
    model.gradient_checkpointing_enable(  # pyright: ignore[reportCallIssue] (torch: attributes are Tensor | Module)
        gradient_checkpointing_kwargs={"use_reentrant": False})


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a causal LM (Hugging Face keeps them in a ModuleList)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
    return list(max(lists, key=len)) if lists else []


def full_state_dict(model: torch.nn.Module, ranks: Ranks) -> dict[str, torch.Tensor]:
    """The whole model's parameters by name, gathered to rank 0's CPU (a collective: every
    rank calls it; the others get {}). Tied weights once, as named_parameters has them."""
    names = [name for name, _ in model.named_parameters()]
    if ranks.world_size == 1:
        return {name: p.detach() for name, p in model.named_parameters()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = cast(dict[str, torch.Tensor],  # full_state_dict: whole tensors, nothing else
                 get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
    return {name: state[name] for name in names} if ranks.is_leader else {}


def balance_by_tokens(items: list[Any], tokens: list[int], num_ranks: int) -> list[list[Any]]:
    """Split items over ranks so their token counts differ by at most one item's: longest
    first, each to the rank with the fewest tokens so far (output lengths are long-tailed, so
    splitting by count would leave ranks waiting on the one with the long samples)."""
    shares: list[list[Any]] = [[] for _ in range(num_ranks)]
    load = [0] * num_ranks
    for i in sorted(range(len(items)), key=lambda i: -tokens[i]):
        r = min(range(num_ranks), key=lambda r: (load[r], r))
        shares[r].append(items[i])
        load[r] += tokens[i]
    return shares
