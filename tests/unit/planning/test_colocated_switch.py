"""Colocated mode's switches as the roofline prices them: generating, the trainer's sharded
state waits in host memory (the engine has the whole GPU); training, the engine has let go of
its KV cache and weights. To training: the state comes back over PCIe. To generation: the state
goes out, every GPU gathers the full weights from the FSDP shards, the KV cache is zeroed again.
Numbers worked out from the catalog and the documented assumptions."""

import pytest

from streamrl.planning.catalog import load_catalog
from streamrl.planning.costs import TrainerMemory
from streamrl.planning.demand import LengthDistribution
from streamrl.planning.estimates import Estimates
from streamrl.planning.planner import PlanJob, Planner
from streamrl.planning.roofline import AnalyticSwitchCost, analytic_generation_cost, analytic_training_cost

CATALOG = load_catalog()
QWEN_7B, QWEN_72B = CATALOG.model("qwen2.5-7b"), CATALOG.model("qwen2.5-72b")
H800 = CATALOG.gpu("H800")


def test_each_switch_moves_the_state_the_weights_and_the_cache_at_their_links():
    p = QWEN_7B.num_params
    switch = AnalyticSwitchCost(analytic_training_cost(QWEN_7B, H800, 8, 2048),
                                analytic_generation_cost(QWEN_7B, H800, 2, 8704))
    state = p * 16 / 8  # weights, gradients, two moments (16 B/parameter) over 8 GPUs
    assert switch.to_training_s() == pytest.approx(state / 25e9)  # host_copy_gb_s 25
    gather = p * 2 * 7 / 8 / (H800.interconnect_gb_s * 1e9 / 2)  # BF16 weights, 7/8 from the others
    g = switch.generation
    cache = g.max_batch * 8704 * g.kv_bytes_per_token_per_gpu / (H800.hbm_gb_s * 1e9)
    assert switch.to_generation_s() == pytest.approx(state / 25e9 + gather + cache)
    assert switch.memory_problem() is None


def test_an_offloaded_trainers_state_stays_on_the_host():
    switch = AnalyticSwitchCost(analytic_training_cost(QWEN_7B, H800, 8, 2048, memory=TrainerMemory(cpu_offload=True)),
                                analytic_generation_cost(QWEN_7B, H800, 2, 8704))
    assert switch.to_training_s() == 0.0
    assert switch.to_generation_s() == pytest.approx(switch.reshard_s() + switch.cache_allocate_s())


def test_state_that_has_no_room_in_host_memory_is_named():
    switch = AnalyticSwitchCost(analytic_training_cost(QWEN_72B, H800, 4, 2048),
                                analytic_generation_cost(QWEN_72B, H800, 4, 8704))
    # 72.7 B x 16 B / 4 GPUs = 290.8 GB per GPU; 256 GB x 0.9 usable
    assert switch.memory_problem() == ("colocated qwen2.5-72b on 4 x H800 parks 290.8 GB of trainer state per GPU in "
                                       "host memory while generating, 230.4 GB usable")


def test_the_paper_72b_ppo_job_plans_colocated_and_streaming_beats_it():
    """The same 48 H800: colocated pays generation, training and both switches in turn; the
    disaggregated stream-sync plan overlaps them and is faster."""
    workload = LengthDistribution.lognormal(7.6, 1.0, 20480, 512)

    def plan(mode: str):
        job = PlanJob(1024, 1, 20480, mode)
        costs = Estimates(QWEN_72B, job, workload, "ppo", True)
        return Planner(CATALOG, costs, job, workload).plan({"dc": {"H800": 48}})

    colocated, streamed = plan("colocated"), plan("stream-sync")
    assert colocated.training.num_gpus == colocated.generation.num_gpus == 48
    switches = colocated.to_training_s + colocated.to_generation_s
    assert switches > 0
    assert colocated.iteration_s == pytest.approx(colocated.generation.seconds + colocated.training.seconds + switches)
    assert colocated.training.memory == TrainerMemory(activation_checkpointing=True, cpu_offload=True)
    assert colocated.to_training_s == 0.0  # offloaded: its state never leaves the host
    assert streamed.iteration_s < colocated.iteration_s
