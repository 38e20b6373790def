"""The trainer's memory features as the planner prices them (`spec.trainer.memory`): activation
checkpointing trades one more forward of every trained model for keeping only each layer's
input; CPU offload moves the sharded state to host memory, pays the copies per micro-batch and
steps the optimizer there. The planner keeps the job's own features and adds what it needs to
fit, the fastest such choice. Numbers worked out from the catalog and the documented assumptions."""

import pytest

from streamrl.planning.catalog import load_catalog
from streamrl.planning.costs import TrainerMemory
from streamrl.planning.demand import LengthDistribution
from streamrl.planning.estimates import Estimates
from streamrl.planning.planner import PlanJob
from streamrl.planning.roofline import (
    MEMORY_CHOICES,
    Assumptions,
    analytic_training_cost,
    forward_passes,
    tensor_parallel_problem,
)

CATALOG = load_catalog()
QWEN_7B, QWEN_72B = CATALOG.model("qwen2.5-7b"), CATALOG.model("qwen2.5-72b")
H800 = CATALOG.gpu("H800")
AC, OFFLOAD = TrainerMemory(activation_checkpointing=True), TrainerMemory(cpu_offload=True)
BOTH = TrainerMemory(activation_checkpointing=True, cpu_offload=True)


def test_checkpointing_recomputes_one_forward_of_each_trained_model():
    assert forward_passes("grpo", reference=True, activation_checkpointing=True) == 5  # 3 + 1 reference + 1
    assert forward_passes("ppo", reference=True, activation_checkpointing=True) == 10  # policy's and critic's
    plain = analytic_training_cost(QWEN_7B, H800, 8, 1024, algorithm="ppo", reference=True)
    checkpointed = analytic_training_cost(QWEN_7B, H800, 8, 1024, algorithm="ppo", reference=True, memory=AC)
    assert checkpointed.train_s(10_000) == pytest.approx(plain.train_s(10_000) * 10 / 8)


def test_activation_memory_with_and_without_checkpointing():
    s = QWEN_72B  # 80 layers, hidden 8192; one 20,992-token sample per micro-batch
    plain = analytic_training_cost(s, H800, 48, 4000, max_sequence_tokens=20992)
    checkpointed = analytic_training_cost(s, H800, 48, 4000, max_sequence_tokens=20992, memory=AC)
    assert plain.activation_bytes() == pytest.approx(20992 * 8192 * 34 * 80)  # 467.7 GB: every layer's
    assert checkpointed.activation_bytes() == pytest.approx(20992 * 8192 * (2 * 80 + 34))  # 33.4 GB
    units = 2 * s.num_params / 80 * (2 + 4)  # two layers unsharded, BF16 weights and FP32 gradients
    assert plain.memory_bytes_per_gpu() - plain.activation_bytes() == pytest.approx(s.num_params * 16 / 48 + units)


def test_offload_moves_the_state_to_the_host_and_pays_for_the_copies_and_the_host_step():
    a = Assumptions()
    on_device = analytic_training_cost(QWEN_72B, H800, 48, 4000, 1, 20992, "ppo", True, memory=AC)
    offloaded = analytic_training_cost(QWEN_72B, H800, 48, 4000, 1, 20992, "ppo", True, memory=BOTH)
    state = QWEN_72B.num_params * (2 * 16 + 2) / 48  # policy and critic 16 B/parameter, the reference's BF16
    assert on_device.memory_bytes_per_gpu() - offloaded.memory_bytes_per_gpu() == pytest.approx(state)
    assert offloaded.host_bytes_per_gpu() == pytest.approx(state) and on_device.host_bytes_per_gpu() == 0
    # per micro-batch: FP32 shards of policy and critic in twice and gradients out, the reference's in once
    copies = QWEN_72B.num_params / 48 * (2 * 3 * 4 + 4) / (a.host_copy_gb_s * 1e9)
    assert offloaded.offload_s_per_micro_batch() == pytest.approx(copies)
    assert offloaded.train_s(10_000, 96) - on_device.train_s(10_000, 96) == pytest.approx(2 * copies)  # 2 each
    assert offloaded.step_s() / on_device.step_s() == pytest.approx(
        H800.hbm_gb_s * a.decode_bandwidth_efficiency / a.host_optimizer_gb_s)
    # the paper's 72B PPO trainer on 48 H800: 51.5 GB of state + 10.9 GB of two layers + 33.4 GB of
    # activations checkpointed; 44.3 GB offloaded as well
    assert "with activation checkpointing needs 95.8 GB per GPU" in on_device.memory_problem()
    assert offloaded.memory_bytes_per_gpu() == pytest.approx(44.3e9, rel=1e-3)
    assert offloaded.memory_problem() is None


def test_the_host_memory_check_names_the_offloaded_state():
    problem = analytic_training_cost(QWEN_72B, H800, 8, 4000, 1, 20992, "ppo", True, memory=BOTH).memory_problem()
    assert problem == ("training qwen2.5-72b on 8 x H800 with activation checkpointing and CPU offload needs 309.0 "
                       "GB of host memory per GPU for the offloaded model state, 230.4 GB usable")


def _estimates(memory: TrainerMemory | None = None, max_new_tokens: int = 20480) -> Estimates:
    job = PlanJob(samples_per_iteration=1024, micro_batch_size=1, max_new_tokens=max_new_tokens)
    workload = LengthDistribution.lognormal(7.6, 1.0, max_new_tokens, 512)
    return Estimates(QWEN_72B, job, workload, "ppo", True, memory=memory)


def test_the_planner_adds_the_fastest_features_that_make_the_trainer_fit_and_keeps_the_jobs_own():
    long = _estimates()
    assert long.training(H800, 48).memory == BOTH  # neither alone holds a 20K-token sample of 72B PPO
    assert "on 48 x H800 needs 530.2 GB per GPU" in long.memory_problem(H800, 48)  # the job's own: none
    short = _estimates(max_new_tokens=1024)  # 1,536-token samples: either alone fits; the fastest is chosen
    assert all(short._analytic_training(H800, 48, m).memory_problem() is None for m in (AC, OFFLOAD, BOTH))
    assert short.memory_problem(H800, 48) is not None  # 51.5 GB of state and 24.5 GB of activations
    fitting = [c for c in (short._analytic_training(H800, 48, m) for m in MEMORY_CHOICES) if c.memory_problem() is None]
    fastest = min(fitting, key=short._busy_s)
    # splitting layers 4 ways holds the activations without recomputing them or copying state
    assert short.training(H800, 48).memory == fastest.memory == TrainerMemory(tensor_parallel=4)
    assert _estimates(OFFLOAD, 1024).training(H800, 48).memory.cpu_offload  # the job's own stay on
    assert _estimates(max_new_tokens=1024).training(H800, 1).startswith(
        "training qwen2.5-72b on 1 x H800 with activation checkpointing needs")  # offload needs 2+ ranks


def test_tensor_parallelism_splits_a_layer_and_pays_two_all_reduces_per_layer_per_pass():
    s = QWEN_72B  # 80 layers, hidden 8192, 64 heads, 8 KV heads, MLP 29568
    plain = analytic_training_cost(s, H800, 48, 4000, max_sequence_tokens=20992, memory=AC)
    split = analytic_training_cost(s, H800, 48, 4000, max_sequence_tokens=20992,
                                   memory=TrainerMemory(activation_checkpointing=True, tensor_parallel=8))
    # the recomputed layer's 34 B/token/hidden become 10 + 24 / 8; the kept inputs stay whole
    assert split.activation_bytes() == pytest.approx(20992 * 8192 * (2 * 80 + 10 + 3))
    unit = 2 * s.num_params / 80 * 6
    assert plain.memory_bytes_per_gpu() - split.memory_bytes_per_gpu() == pytest.approx(
        unit * 7 / 8 + 20992 * 8192 * 21)
    # grpo with checkpointing: forward, backward, recompute = 3 passes of 2 all-reduces per layer,
    # each tensor-parallel group's tokens (a sixth of them): a latency and a ring's 2 x 7/8 of the
    # data over NVLink (400 GB/s, 200 each way)
    tokens = 6_000_000
    group = tokens * 8 / 48 * 8192 * 2
    per_all_reduce = Assumptions().allreduce_latency_s + 2 * 7 / 8 * group / 200e9
    assert split.tensor_parallel_s(tokens) == pytest.approx(3 * 2 * 80 * per_all_reduce)
    assert split.train_s(tokens) == pytest.approx(plain.train_s(tokens) + split.tensor_parallel_s(tokens))


def test_a_tensor_parallel_size_must_divide_the_gpus_a_node_and_the_model():
    assert tensor_parallel_problem(QWEN_72B, H800, 48, 8) is None
    assert tensor_parallel_problem(QWEN_72B, H800, 12, 8) == ("tensor parallel 8 needs a divisor of the 12 GPUs "
                                                              "within one 8-GPU node")
    assert tensor_parallel_problem(QWEN_7B, H800, 16, 8) == ("tensor parallel 8 does not divide "
                                                             "qwen2.5-7b's 28 attention heads")
