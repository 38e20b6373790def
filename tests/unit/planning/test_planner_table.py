"""The stage-balancing planner on cases small enough to work out by hand: a fake cost source
whose generator decodes at a flat step time and whose trainer scales perfectly, so every
iteration time below is arithmetic (worked out in each test's docstring)."""

from dataclasses import dataclass

import pytest

from streamrl.planning.catalog import Catalog, GpuType
from streamrl.planning.demand import LengthDistribution
from streamrl.planning.planned import format_table
from streamrl.planning.planner import Links, PlanJob, Planner, generation_s

SAMPLES = 16
WORKLOAD = LengthDistribution((10,) * 64, prompt_tokens=1, source="fixed")
"""Every output 10 tokens; a trained sample is 1 + 10 = 11 tokens, an iteration 16 x 11 = 176."""


def _gpu(name: str, cost: float = 1.0) -> GpuType:
    return GpuType(name=name, bf16_tflops=100, hbm_gb_s=1000, memory_gb=80, interconnect_gb_s=100, gpus_per_node=8,
                   relative_cost=cost, node_selector={"gpu": name.lower()})


CATALOG = Catalog([_gpu("A"), _gpu("B")], [])


@dataclass(frozen=True)
class _FakeGeneration:
    step: float
    max_batch: int = 4

    def decode_step_s(self, batch: int, context: int) -> float:
        return self.step

    def prefill_s(self, tokens: int) -> float:
        return 0.0


@dataclass(frozen=True)
class _FakeTraining:
    num_gpus: int
    step: float

    def train_s(self, tokens: int, micro_batches: int = 0) -> float:
        return tokens / 44 / self.num_gpus  # 176 tokens: 4 s on one GPU

    def step_s(self) -> float:
        return self.step

    def publish_s(self) -> float:
        return 0.0


@dataclass(frozen=True)
class _FakeSwitch:
    def to_training_s(self) -> float:
        return 0.2

    def to_generation_s(self) -> float:
        return 0.3


class _FakeCosts:
    """Generation: 1-GPU replicas only, step 0.1 s on A, 0.05 s on B. Training: 4 s / GPUs plus a
    fixed optimizer step; B cannot train; A needs at least `min_train` GPUs."""

    weight_bytes = 1e9
    model_name = "fake-model"

    def __init__(self, optimizer_s: float = 0.0, min_train: int = 1):
        self.optimizer_s, self.min_train = optimizer_s, min_train

    def generation(self, gpu, tp):
        if tp != 1:
            return "fake: one GPU per replica"
        return _FakeGeneration(0.1 if gpu.name == "A" else 0.05)

    def training(self, gpu, num_gpus):
        if gpu.name == "B":
            return "fake: B cannot train"
        if num_gpus < self.min_train:
            return f"fake: training needs {self.min_train} GPUs"
        return _FakeTraining(num_gpus, self.optimizer_s)

    def memory_problem(self, gpu, num_gpus):
        return None

    def switch(self, gpu, num_gpus, tp):
        return _FakeSwitch()

    def describe(self, gpu):
        return "fake"


def _planner(costs: _FakeCosts, links: Links | None = None, tolerance: float = 0.0) -> Planner:
    job = PlanJob(SAMPLES, micro_batch_size=4, max_new_tokens=10, mode="stream-async")
    return Planner(CATALOG, costs, job, WORKLOAD, links or Links(network_gb_s=10.0), tolerance)


def test_a_replica_decodes_its_share_in_steps_of_its_batch_or_the_longest_output():
    """16 samples of 10 tokens, batch 4: one replica holds 16 (40 steps), two 8 (20), three 6
    (15), four or more at most 4 (10 steps: the longest output); at 0.1 s a step."""
    gen = _FakeGeneration(0.1)
    got = [generation_s(gen, r, WORKLOAD, SAMPLES) for r in (1, 2, 3, 4, 8)]
    assert got == pytest.approx([4.0, 2.0, 1.5, 1.0, 1.0])


def test_one_datacenter_splits_its_gpus_where_generation_meets_training():
    """8 A GPUs, async: T = max(gen(r), 4/y). gen(4) = 1.0 = 4/4, and r + y = 8 allows nothing
    faster: 4 replicas, 4 trainer GPUs, 1.0 s an iteration, 16 samples/s."""
    plan = _planner(_FakeCosts()).plan({"dc": {"A": 8}})
    assert (plan.generation.replicas, plan.generation.num_gpus, plan.training.num_gpus) == (4, 4, 4)
    assert plan.iteration_s == pytest.approx(1.0)
    assert plan.samples_per_s == pytest.approx(16.0)
    assert plan.released == {}


def test_gpus_that_would_not_make_an_iteration_faster_are_released():
    """16 A GPUs: no generation is faster than 1.0 s (the longest output's 10 steps), so the
    trainer shrinks to the 4 GPUs that keep up and 8 of the 16 are released."""
    plan = _planner(_FakeCosts()).plan({"dc": {"A": 16}})
    assert (plan.generation.replicas, plan.training.num_gpus) == (4, 4)
    assert plan.iteration_s == pytest.approx(1.0)
    assert plan.released == {"dc": {"A": 8}}


def test_the_cheapest_of_the_fastest_wins_and_the_cost_objective_trades_time_for_cost():
    """A 0.5 s optimizer step: T = max(gen(r), 4/y + 0.5). Fastest is 1.5 s, reached by (3, 4),
    (4, 4) and (3, 5); (3, 4) costs 7 GPUs, the others 8. Samples/s per cost = 16 / (T (r + y)):
    (1, 1) gives 16 / (4.5 x 2) = 1.78, above (2, 2) 1.6 and (3, 4) 1.52."""
    planner = _planner(_FakeCosts(optimizer_s=0.5))
    fast = planner.plan({"dc": {"A": 8}}, "time")
    assert (fast.generation.replicas, fast.training.num_gpus, fast.iteration_s) == (3, 4, pytest.approx(1.5))
    cheap = planner.plan({"dc": {"A": 8}}, "cost")
    assert (cheap.generation.replicas, cheap.training.num_gpus, cheap.iteration_s) == (1, 1, pytest.approx(4.5))
    assert cheap.samples_per_s_per_cost == pytest.approx(16 / 9)


def test_two_datacenters_each_run_one_stage_and_the_faster_side_shrinks():
    """West has 16 B (generation at 0.05 s a step: 0.5 s from 4 replicas on), east 16 A (training
    4 / y). All of east would train in 0.25 s, so it shrinks to the 8 GPUs that take 0.5 s, and
    west to its 4 replicas; the cross-datacenter transfer (1 GB at 10 GB/s = 0.1 s) overlaps."""
    links = Links(cross_dc_gb_s=10.0, cross_dc_latency_s=0.0)
    plan = _planner(_FakeCosts(), links).plan({"west": {"B": 16}, "east": {"A": 16}})
    assert (plan.generation.datacenter, plan.generation.gpu.name, plan.generation.replicas) == ("west", "B", 4)
    assert (plan.training.datacenter, plan.training.gpu.name, plan.training.num_gpus) == ("east", "A", 8)
    assert plan.iteration_s == pytest.approx(0.5)
    assert plan.weight_sync_s == pytest.approx(0.1)
    assert plan.released == {"west": {"B": 12}, "east": {"A": 8}}


def test_a_budget_that_cannot_hold_the_trainer_is_refused_naming_the_model_type_and_least_count():
    with pytest.raises(ValueError) as err:
        _planner(_FakeCosts(min_train=4)).plan({"dc": {"A": 3}})
    message = str(err.value)
    assert message.startswith("budget too small for fake-model: the trainer fits nowhere")
    assert "dc/A: fake: training needs 4 GPUs; at least 4 x A would hold it" in message


def test_a_budget_that_holds_each_stage_but_not_both_is_refused():
    """Training needs 4 A and a replica 1: 4 A GPUs cannot hold both."""
    with pytest.raises(ValueError, match=r"budget too small for fake-model: no split of dc: 4 x A holds both"):
        _planner(_FakeCosts(min_train=4)).plan({"dc": {"A": 4}})


def test_an_unknown_gpu_type_in_the_budget_is_named():
    with pytest.raises(ValueError, match=r"--gpus 'H300': not in the GPU catalog \(known: A, B\)"):
        _planner(_FakeCosts()).plan({"dc": {"H300": 8}})


def test_three_datacenters_are_refused():
    with pytest.raises(ValueError, match="names 3 datacenters"):
        _planner(_FakeCosts()).plan({"a": {"A": 1}, "b": {"A": 1}, "c": {"A": 1}})


def test_the_table_shows_each_stage_and_the_iteration():
    plan = _planner(_FakeCosts(optimizer_s=0.5)).plan({"dc": {"A": 8}})
    table = format_table(plan, "fake-model", WORKLOAD)
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.startswith(("generation", "training"))}
    #                     dc    gpu  gpus tp   replicas max batch seconds utilisation cost source
    assert rows["generation"][1:] == ["dc", "A", "3", "1", "3", "4", "1.50", "100%", "3.00", "fake"]
    assert rows["training"][1:] == ["dc", "A", "4", "-", "-", "-", "1.50", "100%", "4.00", "fake"]
    assert "iteration 1.50 s" in table and "10.7 samples/s" in table
    assert "released (not needed): dc: 1 x A" in table


def test_an_unknown_mode_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"spec.pipeline.mode 'pipelined': expected colocated, batch"):
        PlanJob(SAMPLES, 4, 10, "pipelined")


def test_colocated_takes_turns_on_one_set_of_gpus_and_pays_both_switches():
    """Colocated on 8 A: N GPUs all train and each is a 1-GPU replica, T = gen(N) + 4/N + S +
    switches, S = 0.5, switches 0.2 + 0.3. N = 4: 1.0 + 1.0 + 1.0 = 3.0; N = 8: 1.0 + 0.5 + 1.0
    = 2.5, the best. The cost is the 8 GPUs once, nothing released."""
    job = PlanJob(SAMPLES, micro_batch_size=4, max_new_tokens=10, mode="colocated")
    plan = Planner(CATALOG, _FakeCosts(optimizer_s=0.5), job, WORKLOAD, Links(network_gb_s=10.0), 0.0).plan(
        {"dc": {"A": 8}})
    assert (plan.generation.replicas, plan.generation.num_gpus, plan.training.num_gpus) == (8, 8, 8)
    assert plan.iteration_s == pytest.approx(2.5)
    assert (plan.to_training_s, plan.to_generation_s) == pytest.approx((0.2, 0.3))
    assert plan.cost == pytest.approx(8.0) and plan.released == {}
    table = format_table(plan, "fake-model", WORKLOAD)
    assert "iteration 2.50 s (switches 0.50 s: to training 0.20, to generation 0.30)" in table
    assert "cost 8.00 per unit time (the GPUs both stages share)" in table


def test_colocated_needs_one_datacenter_and_a_type_that_both_trains_and_generates():
    job = PlanJob(SAMPLES, micro_batch_size=4, max_new_tokens=10, mode="colocated")
    planner = Planner(CATALOG, _FakeCosts(), job, WORKLOAD, Links(network_gb_s=10.0), 0.0)
    with pytest.raises(ValueError, match="colocated generation and training share one set of GPUs, so name one"):
        planner.plan({"x": {"A": 4}, "y": {"A": 4}})
    with pytest.raises(ValueError, match="the trainer fits nowhere\n  dc/B: fake: B cannot train"):
        planner.plan({"dc": {"B": 4}})


def test_stream_sync_pays_the_last_micro_batch_the_step_and_the_transfer_after_generation():
    """stream-sync, 8 A: T = max(gen(r) + f, F(y)) + S + W, with F(y) = 4/y, the last micro-batch
    f = 4 x y samples x 11 tokens / 44 / y = 1.0 s, S = 0.5, W = 1 GB at 10 GB/s = 0.1 s.
    Generation is 1.0 s from 4 replicas on, so T >= 2.0 + 0.6 = 2.6, reached with y >= 2
    (F(2) = 2.0); 3 replicas give 3.1, one trainer GPU 4.6. The cheapest at 2.6: (4, 2)."""
    job = PlanJob(SAMPLES, micro_batch_size=4, max_new_tokens=10, mode="stream-sync")
    planner = Planner(CATALOG, _FakeCosts(optimizer_s=0.5), job, WORKLOAD, Links(network_gb_s=10.0), 0.0)
    plan = planner.plan({"dc": {"A": 8}})
    assert (plan.generation.replicas, plan.training.num_gpus) == (4, 2)
    assert plan.iteration_s == pytest.approx(2.6)
    assert plan.weight_sync_s == pytest.approx(0.1)
