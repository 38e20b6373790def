"""The analytic cost model for hardware without a profile: a decode step is the slower of
streaming the weights and the KV cache from memory and doing its FLOPs (with tensor
parallelism's all-reduces), training is 6 FLOPs per parameter per token (plus reference and
critic passes) with its matmuls and its attention each at a fraction of peak fitted to published
training throughputs, and a memory check rules out what does not fit.

Every number that is an assumption rather than a spec is a field of `Assumptions`, with its
source; `docs/planning.md` says how to calibrate them from a measured profile."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from streamrl.planning.catalog import GpuType
from streamrl.planning.costs import Algorithm, TrainerMemory, forward_passes, trained_models
from streamrl.planning.shape import ModelShape
from streamrl.planning.training_fit import training_flops


class Assumptions(BaseModel):
    """The analytic model's constants that are not datasheet figures. Defaults are typical
    published values; a measured profile is the way to replace them."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    weight_bytes_per_param: float = Field(default=2.0, gt=0)
    """Bytes of one parameter as generators hold it and the trainer computes with it (BF16)."""
    kv_bytes_per_value: float = Field(default=2.0, gt=0)
    """Bytes of one cached key or value element (BF16 KV cache, vLLM's default `kv_cache_dtype=auto`)."""
    decode_bandwidth_efficiency: float = Field(default=0.7, gt=0, le=1)
    """Fraction of peak memory bandwidth a decode step achieves reading weights and KV cache.
    Fitted to deploy/catalog/measurements.yaml (vLLM, LMDeploy and TensorRT-LLM on A100, H100,
    H200: 0.70); Databricks ('LLM Inference Performance Engineering', 2023) reports 60-70%
    model bandwidth utilisation."""
    decode_compute_efficiency: float = Field(default=0.8, gt=0, le=1)
    """Fraction of peak tensor FLOP/s a decode step's batch-sized matmuls reach once
    compute-bound. Fitted to deploy/catalog/measurements.yaml, where TensorRT-LLM's batches of
    1,024 (Llama-2 70B, A100) decide it and take it to the fit's upper bound, 0.8 (LMDeploy's
    batch-64 decodes alone gave 0.185)."""
    prefill_compute_efficiency: float = Field(default=0.68, gt=0, le=1)
    """Fraction of peak FLOP/s of prefill (large GEMMs). Fitted to deploy/catalog/measurements.yaml
    (first-token latencies of 2,048-token prompts on A100, and 20K-token prompts in
    TensorRT-LLM's throughput runs)."""
    decode_step_overhead_s: float = Field(default=0.0013, ge=0)
    """Fixed seconds per decode step: sampling, scheduling, kernel launches. Fitted to
    deploy/catalog/measurements.yaml."""
    allreduce_latency_s: float = Field(default=2.5e-5, ge=0)
    """Fixed seconds of one tensor-parallel all-reduce, two per layer per step. Fitted to
    deploy/catalog/measurements.yaml (vLLM at batch 8 and TensorRT-LLM at tensor parallel 4
    and 8): the order of NCCL's small-message latency on NVLink in nccl-tests."""
    decode_allreduce_bandwidth_efficiency: float = Field(default=0.11, gt=0, le=1)
    """Fraction of the interconnect's bandwidth (each way) a tensor-parallel all-reduce of a
    decode step's activations reaches (prefill's and training's, hundreds of MB, are taken at
    the full bandwidth). Fitted to deploy/catalog/measurements.yaml: TensorRT-LLM's
    large batches at tensor parallel 8 ran 1.4-2x slower than the roofline at full bandwidth (a
    1-4 MB all-reduce is far from NCCL's peak bus bandwidth in nccl-tests)."""
    memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Fraction of GPU memory usable for weights, KV cache, optimizer state and activations
    (vLLM's `gpu_memory_utilization` default)."""
    engine_max_batch: int = Field(default=256, ge=1)
    """The most sequences an engine runs at once, whatever memory allows (vLLM's `max_num_seqs` default)."""
    train_matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of peak FLOP/s that training's matmuls reach. None: the GPU type's own, which
    the catalog fits to published training throughputs (deploy/catalog/training.yaml,
    streamrl/planning/training_fit.py); set it (or calibrate from a profile) to override."""
    train_attention_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of peak FLOP/s that training's attention reaches (flash attention's kernels,
    below the GEMMs'). None: as train_matmul_efficiency; with that one set alone, the same value."""
    optimizer_bytes_per_param: float = Field(default=16.0, gt=0)
    """Training bytes per parameter: weights, gradients and AdamW's two moments in mixed
    precision (ZeRO, Rajbhandari et al. 2020: 2 + 2 + 12 = 16; FP32 FSDP: 4 + 4 + 8 = 16)."""
    optimizer_bytes_touched_per_param: float = Field(default=28.0, gt=0)
    """Bytes AdamW's step reads and writes per parameter (reads FP32 parameter, gradient and
    two moments, writes parameter and moments: 7 x 4); the step is memory-bound."""
    checkpoint_bytes_per_token_per_hidden: float = Field(default=2.0, ge=0)
    """Activation bytes kept per token per layer per hidden unit with full activation
    checkpointing (the layer's BF16 input; Korthikanti et al. 2022)."""
    layer_working_bytes_per_token_per_hidden: float = Field(default=34.0, ge=0)
    """Activation bytes per token per hidden unit of the one layer being recomputed
    (Korthikanti et al. 2022's 34·s·b·h, attention's s² term gone with flash attention)."""
    layer_replicated_bytes_per_token_per_hidden: float = Field(default=10.0, ge=0)
    """Of those, the bytes tensor parallelism does not split (the norms' and dropouts' inputs:
    Korthikanti et al.'s 10 of 34 without sequence parallelism; the other 24 divide by t)."""
    host_copy_gb_s: float = Field(default=25.0, gt=0)
    """GB/s between a GPU and host memory: publishing's copy of the gathered weights, and with
    CPU offload each layer's parameters in and gradients out (PCIe Gen4 x16, 32 GB/s peak, ~25
    achieved)."""
    host_memory_gb_per_gpu: float = Field(default=256.0, gt=0)
    """Host memory per GPU, GB, that CPU offload may fill (NVIDIA DGX H100 datasheet: 2 TB of
    system memory for 8 GPUs)."""
    host_optimizer_gb_s: float = Field(default=20.0, gt=0)
    """GB/s per GPU at which the optimizer step streams its state when it runs on the host (CPU
    offload): an assumption, a fraction of a node's DDR5 bandwidth (2 sockets x 8 channels of
    DDR5-4800: 614 GB/s, 77 GB/s per GPU of 8) that torch's multi-tensor CPU AdamW reaches."""


FALLBACK_TRAIN_EFFICIENCY = 0.4
"""Training's fraction of peak on a GPU type the catalog has no efficiency for (one built
outside a catalog, or a catalog without training rows): Megatron-LM's 44-52% MFU on A100
(Narayanan et al. 2021), lower for RL's short, variable sequences."""


def _tp_allreduce_s(gpu: GpuType, tp: int, tokens: float, hidden: int, num_layers: int, a: Assumptions,
                    bandwidth_efficiency: float = 1.0) -> float:
    """Two all-reduces per layer of [tokens, hidden] activations over the node's interconnect: a
    fixed latency, and a ring's 2 (tp - 1) / tp of the data at `bandwidth_efficiency` of it."""
    if tp == 1:
        return 0.0
    size = tokens * hidden * a.weight_bytes_per_param
    per_direction = gpu.interconnect_gb_s * 1e9 / 2 * bandwidth_efficiency
    return 2 * num_layers * (a.allreduce_latency_s + 2 * (tp - 1) / tp * size / per_direction)


@dataclass(frozen=True)
class AnalyticGenerationCost:
    """One generator replica: `tp` GPUs of `gpu` in one tensor-parallel group (a GenerationCost)."""

    shape: ModelShape
    gpu: GpuType
    tp: int
    max_context: int
    """Prompt + longest output, tokens: what one sequence's KV cache must hold."""
    assumptions: Assumptions = Assumptions()
    prompt_tokens: int = 0
    """A prompt's tokens: its prefill attends over half of them on average (a 20K-token
    prompt's attention adds a fifth to a 70B model's prefill FLOPs)."""

    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.shape.num_params * self.assumptions.weight_bytes_per_param / self.tp

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        """KV heads are split over the group; with fewer KV heads than GPUs each holds one (replicated)."""
        heads_per_gpu = math.ceil(self.shape.num_kv_heads / self.tp)
        return self.shape.kv_values_per_token() / self.shape.num_kv_heads * heads_per_gpu * \
            self.assumptions.kv_bytes_per_value

    @property
    def usable_bytes_per_gpu(self) -> float:
        return self.gpu.memory_gb * 1e9 * self.assumptions.memory_utilization

    def memory_problem(self) -> str | None:
        """Why this replica cannot run one sequence of max_context tokens (None: it can)."""
        need = self.weight_bytes_per_gpu + self.max_context * self.kv_bytes_per_token_per_gpu
        if need <= self.usable_bytes_per_gpu:
            return None
        return (f"{self.shape.name} on {self.tp} x {self.gpu.name} needs {need / 1e9:.1f} GB per GPU (weights "
                f"{self.weight_bytes_per_gpu / 1e9:.1f} GB + one {self.max_context}-token KV cache), "
                f"{self.usable_bytes_per_gpu / 1e9:.1f} GB usable")

    @property
    def max_batch(self) -> int:
        """Sequences of max_context tokens whose KV cache fits beside the weights, at most engine_max_batch."""
        free = self.usable_bytes_per_gpu - self.weight_bytes_per_gpu
        fit = int(free // (self.max_context * self.kv_bytes_per_token_per_gpu)) if free > 0 else 0
        return max(0, min(self.assumptions.engine_max_batch, fit))

    def decode_step_s(self, batch: int, context: int) -> float:
        a, s = self.assumptions, self.shape
        memory_s = (self.weight_bytes_per_gpu + batch * context * self.kv_bytes_per_token_per_gpu) / (
            self.gpu.hbm_gb_s * 1e9 * a.decode_bandwidth_efficiency)
        compute_s = batch * s.forward_flops_per_token(context) / self.tp / (
            self.gpu.bf16_tflops * 1e12 * a.decode_compute_efficiency)
        comm_s = _tp_allreduce_s(self.gpu, self.tp, batch, s.hidden_size, s.num_layers, a,
                                 a.decode_allreduce_bandwidth_efficiency)
        return a.decode_step_overhead_s + max(memory_s, compute_s) + comm_s

    def prefill_s(self, tokens: int) -> float:
        a, s = self.assumptions, self.shape
        compute_s = tokens * s.forward_flops_per_token(self.prompt_tokens / 2) / self.tp / (
            self.gpu.bf16_tflops * 1e12 * a.prefill_compute_efficiency)
        memory_s = self.weight_bytes_per_gpu / (self.gpu.hbm_gb_s * 1e9 * a.decode_bandwidth_efficiency)
        return max(compute_s, memory_s) + _tp_allreduce_s(self.gpu, self.tp, tokens, s.hidden_size, s.num_layers, a)


MEMORY_CHOICES = tuple(TrainerMemory(ac, offload, tp) for tp in (1, 2, 4, 8) for offload in (False, True)
                       for ac in (False, True))
"""Every combination the trainer offers; a plan takes those that divide its GPUs and the model."""


def tensor_parallel_problem(shape: ModelShape, gpu: GpuType, num_gpus: int, tp: int) -> str | None:
    """Why a trainer of `num_gpus` x `gpu` cannot split layers `tp` ways (None: it can)."""
    if tp == 1:
        return None
    if tp > gpu.gpus_per_node or num_gpus % tp:
        return f"tensor parallel {tp} needs a divisor of the {num_gpus} GPUs within one {gpu.gpus_per_node}-GPU node"
    for name, n in (("attention heads", shape.num_heads), ("KV heads", shape.num_kv_heads),
                    ("MLP width", shape.intermediate_size)):
        if n % tp:
            return f"tensor parallel {tp} does not divide {shape.name}'s {n} {name}"
    return None


@dataclass(frozen=True)
class AnalyticTrainingCost:
    """The trainer stage: `num_gpus` GPUs of `gpu` sharding the model (FSDP), a TrainingCost."""

    shape: ModelShape
    gpu: GpuType
    num_gpus: int
    mean_sequence_tokens: float
    """Mean prompt + output tokens of a trained sample (attention's cost grows with it)."""
    micro_batch_size: int = 1
    """Samples per forward/backward on one GPU (the activation memory)."""
    max_sequence_tokens: int = 0
    """Longest sample, tokens (activation memory; 0 = mean_sequence_tokens)."""
    algorithm: Algorithm = "grpo"
    reference: bool = False
    """A reference model's forward (the KL term, `algorithm.klCoef` > 0)."""
    assumptions: Assumptions = Assumptions()
    memory: TrainerMemory = TrainerMemory()

    @property
    def flops_per_token(self) -> tuple[float, float]:
        """(matmul, attention) FLOPs per trained token, over every pass of every model."""
        passes = forward_passes(self.algorithm, self.reference, self.memory.activation_checkpointing)
        return training_flops(self.shape, self.mean_sequence_tokens, passes)

    @property
    def efficiencies(self) -> tuple[float, float]:
        """(matmul, attention) fractions of peak: the assumptions' if set, else the GPU type's
        (fitted by the catalog), else FALLBACK_TRAIN_EFFICIENCY."""
        a, g = self.assumptions, self.gpu
        if a.train_matmul_efficiency is not None:
            return a.train_matmul_efficiency, a.train_attention_efficiency or a.train_matmul_efficiency
        if g.train_matmul_efficiency is not None and g.train_attention_efficiency is not None:
            return g.train_matmul_efficiency, g.train_attention_efficiency
        return FALLBACK_TRAIN_EFFICIENCY, FALLBACK_TRAIN_EFFICIENCY

    def compute_s_per_token(self) -> float:
        """Seconds of FLOPs per trained token on one GPU."""
        (matmul, attention), (em, ea) = self.flops_per_token, self.efficiencies
        return (matmul / em + attention / ea) / (self.gpu.bf16_tflops * 1e12)

    def offload_s_per_micro_batch(self) -> float:
        """CPU offload: each rank copies its FP32 parameter shards in for the forward and again for
        the backward (the reference: forward only), and its gradient shards out."""
        if not self.memory.cpu_offload:
            return 0.0
        trained = self.shape.num_params * trained_models(self.algorithm) / self.num_gpus
        reference = self.shape.num_params / self.num_gpus if self.reference else 0.0
        return (trained * 3 * 4 + reference * 4) / (self.assumptions.host_copy_gb_s * 1e9)

    def tensor_parallel_s(self, tokens: int) -> float:
        """Tensor parallelism's all-reduces: two per layer per pass (a trained model's forward,
        its backward, a recompute; the reference's and the critic's value forward) of each
        tensor-parallel group's [tokens, hidden] activations, the groups side by side."""
        t = self.memory.tensor_parallel
        if t == 1:
            return 0.0
        passes = forward_passes(self.algorithm, self.reference, self.memory.activation_checkpointing) - \
            trained_models(self.algorithm)  # a backward is two forwards of FLOPs but one pass of all-reduces
        group_tokens = tokens * t / self.num_gpus
        return passes * _tp_allreduce_s(self.gpu, t, group_tokens, self.shape.hidden_size, self.shape.num_layers,
                                        self.assumptions)

    def train_s(self, tokens: int, micro_batches: int = 0) -> float:
        per_rank = -(-micro_batches // self.num_gpus)
        return tokens * self.compute_s_per_token() / self.num_gpus + per_rank * self.offload_s_per_micro_batch() + \
            self.tensor_parallel_s(tokens)

    def step_s(self) -> float:
        a = self.assumptions
        touched = self.shape.num_params * trained_models(self.algorithm) * a.optimizer_bytes_touched_per_param
        gb_s = a.host_optimizer_gb_s if self.memory.cpu_offload else self.gpu.hbm_gb_s * a.decode_bandwidth_efficiency
        return touched / self.num_gpus / (gb_s * 1e9)

    def publish_s(self) -> float:
        """Gather the full weights to rank 0 over the interconnect, then copy them to host memory."""
        a = self.assumptions
        size = self.shape.num_params * a.weight_bytes_per_param
        gather = size * (self.num_gpus - 1) / self.num_gpus / (self.gpu.interconnect_gb_s * 1e9 / 2)
        return gather + size / (a.host_copy_gb_s * 1e9)

    def activation_bytes(self) -> float:
        """One micro-batch of the longest samples: every layer's activations (Korthikanti et al.'s
        34 bytes per token per hidden unit, of which tensor parallelism splits 24), or with
        checkpointing each layer's input and one layer's activations."""
        a, s = self.assumptions, self.shape
        tokens = self.micro_batch_size * (self.max_sequence_tokens or self.mean_sequence_tokens)
        replicated = min(a.layer_replicated_bytes_per_token_per_hidden, a.layer_working_bytes_per_token_per_hidden)
        per_layer = replicated + (a.layer_working_bytes_per_token_per_hidden - replicated) / self.memory.tensor_parallel
        if self.memory.activation_checkpointing:
            return tokens * s.hidden_size * (a.checkpoint_bytes_per_token_per_hidden * s.num_layers + per_layer)
        return tokens * s.hidden_size * per_layer * s.num_layers

    def memory_bytes_per_gpu(self) -> float:
        """Device bytes: the sharded model state (policy, a critic's, a reference's weights) unless
        offloaded, two FSDP units unsharded (the one computing and the one prefetched, BF16
        weights and FP32 gradients; a tensor-parallel rank's slice of them), and one
        micro-batch's activations."""
        a, s = self.assumptions, self.shape
        unit = 2 * s.num_params / s.num_layers * (a.weight_bytes_per_param + 4) / self.memory.tensor_parallel
        return self.state_bytes_on_device() + unit + self.activation_bytes()

    def state_bytes_per_gpu(self) -> float:
        """The sharded model state per GPU: each trained model's weights, gradients and moments
        (optimizer_bytes_per_param), a reference's weights."""
        a, s = self.assumptions, self.shape
        states = s.num_params * a.optimizer_bytes_per_param * trained_models(self.algorithm)
        states += s.num_params * a.weight_bytes_per_param if self.reference else 0.0
        return states / self.num_gpus

    def state_bytes_on_device(self) -> float:
        """Device bytes per GPU of the sharded model state (0 with CPU offload)."""
        return 0.0 if self.memory.cpu_offload else self.state_bytes_per_gpu()

    def host_bytes_per_gpu(self) -> float:
        """Host bytes per GPU with CPU offload: the sharded model state (0 without)."""
        return self.state_bytes_per_gpu() if self.memory.cpu_offload else 0.0

    def memory_problem(self) -> str | None:
        """Why this trainer does not fit (None: it does)."""
        a = self.assumptions
        need, usable = self.memory_bytes_per_gpu(), self.gpu.memory_gb * 1e9 * a.memory_utilization
        using = f" with {' and '.join(self.memory.names())}" if self.memory.names() else ""
        if need > usable:
            state = ("model state offloaded" if self.memory.cpu_offload else
                     f"{a.optimizer_bytes_per_param:g} B/parameter of model state sharded")
            return (f"training {self.shape.name} on {self.num_gpus} x {self.gpu.name}{using} needs "
                    f"{need / 1e9:.1f} GB per GPU ({state}, {self.activation_bytes() / 1e9:.1f} GB of activations), "
                    f"{usable / 1e9:.1f} GB usable")
        host, host_usable = self.host_bytes_per_gpu(), a.host_memory_gb_per_gpu * 1e9 * a.memory_utilization
        if host > host_usable:
            return (f"training {self.shape.name} on {self.num_gpus} x {self.gpu.name}{using} needs "
                    f"{host / 1e9:.1f} GB of host memory per GPU for the offloaded model state, "
                    f"{host_usable / 1e9:.1f} GB usable")
        return None


@dataclass(frozen=True)
class AnalyticSwitchCost:
    """Colocated mode on `training.num_gpus` GPUs, each also a tensor-parallel shard of a
    generator replica (a SwitchCost). While generating, the trainer's sharded model state waits
    in host memory (so the engine has the whole GPU, as AnalyticGenerationCost prices it); while
    training, the engine has let go of its KV cache and weights (vLLM's sleep mode, level 2: the
    next version replaces them anyway)."""

    training: AnalyticTrainingCost
    generation: AnalyticGenerationCost

    def state_copy_s(self) -> float:
        """One way between device and host of the trainer's sharded state (none with CPU
        offload: it lives on the host already)."""
        return self.training.state_bytes_on_device() / (self.training.assumptions.host_copy_gb_s * 1e9)

    def reshard_s(self) -> float:
        """The new version into the engine's layout: every GPU gathers the full weights from the
        FSDP shards (DTensor's full_tensor, unit by unit) and keeps its tensor-parallel slice."""
        t = self.training
        size = t.shape.num_params * t.assumptions.weight_bytes_per_param
        return size * (t.num_gpus - 1) / t.num_gpus / (t.gpu.interconnect_gb_s * 1e9 / 2)

    def cache_allocate_s(self) -> float:
        """The KV cache zeroed again at memory bandwidth."""
        g = self.generation
        kv = g.max_batch * g.max_context * g.kv_bytes_per_token_per_gpu
        return kv / (g.gpu.hbm_gb_s * 1e9)

    def to_training_s(self) -> float:
        return self.state_copy_s()

    def to_generation_s(self) -> float:
        return self.state_copy_s() + self.reshard_s() + self.cache_allocate_s()

    def memory_problem(self) -> str | None:
        """Why the trainer's state does not fit in host memory while generating (None: it does)."""
        t, a = self.training, self.training.assumptions
        host, usable = t.state_bytes_per_gpu(), a.host_memory_gb_per_gpu * 1e9 * a.memory_utilization
        if host > usable:
            return (f"colocated {t.shape.name} on {t.num_gpus} x {t.gpu.name} parks {host / 1e9:.1f} GB of trainer "
                    f"state per GPU in host memory while generating, {usable / 1e9:.1f} GB usable")
        return None


def analytic_generation_cost(shape: ModelShape, gpu: GpuType, tp: int, max_context: int,
                             assumptions: Assumptions | None = None, prompt_tokens: int = 0) -> AnalyticGenerationCost:
    """A replica's GenerationCost from the roofline (tp GPUs of one node)."""
    if not 1 <= tp <= gpu.gpus_per_node:
        raise ValueError(f"tensor-parallel size {tp}: must be 1..{gpu.gpus_per_node} (one {gpu.name} node)")
    return AnalyticGenerationCost(shape, gpu, tp, max_context, assumptions or Assumptions(), prompt_tokens)


def analytic_training_cost(shape: ModelShape, gpu: GpuType, num_gpus: int, mean_sequence_tokens: float,
                           micro_batch_size: int = 1, max_sequence_tokens: int = 0, algorithm: Algorithm = "grpo",
                           reference: bool = False, assumptions: Assumptions | None = None,
                           memory: TrainerMemory | None = None) -> AnalyticTrainingCost:
    """The trainer's TrainingCost from 6N FLOPs per token at an MFU (num_gpus GPUs of one type)."""
    if num_gpus < 1:
        raise ValueError(f"training GPUs {num_gpus}: must be at least 1")
    return AnalyticTrainingCost(shape, gpu, num_gpus, mean_sequence_tokens, micro_batch_size, max_sequence_tokens,
                                algorithm, reference, assumptions or Assumptions(), memory or TrainerMemory())
