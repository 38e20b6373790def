"""The analytic model's shape on known hardware: a 7B model's decode step on an H20-class GPU
is flat while the weights dominate and rises once compute does; training seconds per token
follow the parameter count; the memory check keeps out what does not fit. Numbers worked out
from the catalog's figures and the documented assumptions."""

import pytest

from streamrl.planning.catalog import load_catalog
from streamrl.planning.costs import GenerationCost, TrainingCost
from streamrl.planning.roofline import Assumptions, analytic_generation_cost, analytic_training_cost, forward_passes

CATALOG = load_catalog()
QWEN_7B = CATALOG.model("qwen2.5-7b")
H20 = CATALOG.gpu("H20")
H800 = CATALOG.gpu("H800")
A = Assumptions()


def test_a_7b_decode_step_on_an_h20_is_flat_then_rising_in_batch_size():
    cost = analytic_generation_cost(QWEN_7B, H20, tp=1, max_context=8704)
    assert isinstance(cost, GenerationCost)
    steps = {b: cost.decode_step_s(b, 1024) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)}
    # Batch 1: the step's overhead + (15.24 GB weights + 1024 x 57,344 B of KV) / (4.0 TB/s x bandwidth efficiency).
    weights = QWEN_7B.num_params * 2
    assert steps[1] == pytest.approx(A.decode_step_overhead_s + (weights + 1024 * 57344) / (
        4000e9 * A.decode_bandwidth_efficiency), rel=1e-9)
    assert steps[8] / steps[1] < 1.06  # flat: the weights' bytes dominate (H20: 148 TFLOPS for 4 TB/s)
    assert steps[256] / steps[64] > 3.0  # rising: compute-bound, ~linear in the batch
    assert all(steps[a] <= steps[b] for a, b in zip(list(steps), list(steps)[1:]))
    # Compute-bound at 256: 256 tokens x 2 x 7.07e9 matmul parameters (+ attention) at 148 TFLOPS x compute efficiency.
    flops = 256 * QWEN_7B.forward_flops_per_token(1024)
    assert steps[256] == pytest.approx(A.decode_step_overhead_s + flops / (148e12 * A.decode_compute_efficiency),
                                       rel=1e-9)


def test_tensor_parallelism_shortens_a_memory_bound_step_and_replicates_scarce_kv_heads():
    one = analytic_generation_cost(QWEN_7B, H20, tp=1, max_context=8704)
    four = analytic_generation_cost(QWEN_7B, H20, tp=4, max_context=8704)
    eight = analytic_generation_cost(QWEN_7B, H20, tp=8, max_context=8704)
    # A quarter of the weights' bytes per GPU, plus 2 x 28 all-reduces, each a latency and a ring's
    # 2 x 3/4 of the [1, 3584] BF16 activations over NVLink (450 GB/s each way, at the fitted share).
    memory_s = (QWEN_7B.num_params * 2 / 4 + 1024 * 57344 / 4) / (4000e9 * A.decode_bandwidth_efficiency)
    nvlink_each_way = 450e9 * A.decode_allreduce_bandwidth_efficiency
    allreduce_s = 2 * 28 * (A.allreduce_latency_s + 2 * 3 / 4 * 3584 * 2 / nvlink_each_way)
    assert four.decode_step_s(1, 1024) == pytest.approx(A.decode_step_overhead_s + memory_s + allreduce_s, rel=1e-9)
    assert four.decode_step_s(1, 1024) < 0.7 * one.decode_step_s(1, 1024)  # 56 all-reduce latencies keep it above 1/4
    assert four.kv_bytes_per_token_per_gpu == one.kv_bytes_per_token_per_gpu / 4  # 4 KV heads, one per GPU
    assert eight.kv_bytes_per_token_per_gpu == four.kv_bytes_per_token_per_gpu  # still one head per GPU


def test_training_seconds_per_token_follow_the_parameter_count():
    per_token = {}
    for name in ("qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b"):
        shape = CATALOG.model(name)
        cost = analytic_training_cost(shape, H800, num_gpus=64, mean_sequence_tokens=2)
        assert isinstance(cost, TrainingCost)
        per_token[name] = (cost.train_s(1_000_000) / 1e6, shape.matmul_params)
        # 6 FLOPs per matmul parameter per token (attention over one token is negligible) at the matmul
        # efficiency the catalog fitted (H800 trains like H100) of 64 x 989.5 TFLOPS.
        assert H800.train_matmul_efficiency is not None and 0.3 < H800.train_matmul_efficiency < 0.8
        assert per_token[name][0] == pytest.approx(
            6 * shape.matmul_params / (64 * 989.5e12 * H800.train_matmul_efficiency), rel=1e-3)
    seconds_7b, params_7b = per_token["qwen2.5-7b"]
    for seconds, params in per_token.values():
        assert seconds / seconds_7b == pytest.approx(params / params_7b, rel=1e-3)
    assert per_token["qwen2.5-72b"][0] / seconds_7b > 9  # 72.7 B vs 7.6 B parameters


def test_reference_and_critic_passes_add_their_forwards_and_backwards():
    assert forward_passes("grpo", reference=False) == 3
    assert forward_passes("grpo", reference=True) == 4
    assert forward_passes("ppo", reference=True) == 8
    grpo = analytic_training_cost(QWEN_7B, H800, 8, 1024)
    ppo = analytic_training_cost(QWEN_7B, H800, 8, 1024, algorithm="ppo", reference=True)
    assert ppo.train_s(1000) == pytest.approx(grpo.train_s(1000) * 8 / 3)


def test_the_memory_check_rules_out_what_does_not_fit_and_sizes_the_kv_cache():
    big = CATALOG.model("qwen2.5-72b")
    problem = analytic_generation_cost(big, H20, tp=1, max_context=8704).memory_problem()
    assert problem is not None and "qwen2.5-72b on 1 x H20 needs 148.3 GB per GPU (weights 145.4 GB" in problem
    assert analytic_generation_cost(big, H20, tp=8, max_context=8704).memory_problem() is None
    # 7B on one H20: (96 GB x 0.9 - 15.24 GB of weights) / (8704 tokens x 57,344 B) = 142 sequences.
    assert analytic_generation_cost(QWEN_7B, H20, 1, 8704).max_batch == 142
    assert analytic_generation_cost(QWEN_7B, H20, 1, 512, Assumptions(engine_max_batch=64)).max_batch == 64
    # Training 7B needs 16 B/parameter of state: 122 GB over 1 H800 does not fit, over 8 it does.
    assert "training qwen2.5-7b on 1 x H800 needs" in analytic_training_cost(QWEN_7B, H800, 1, 1024).memory_problem()
    assert analytic_training_cost(QWEN_7B, H800, 8, 1024).memory_problem() is None


def test_a_tensor_parallel_size_beyond_one_node_is_refused():
    with pytest.raises(ValueError, match=r"tensor-parallel size 16: must be 1..8 \(one H20 node\)"):
        analytic_generation_cost(QWEN_7B, H20, tp=16, max_context=1024)
