"""The planned job: the plan written into the user's job (pool, placement, replicas, trainer
ranks; the remote datacenter's clusterRef) and accepted as the cluster would accept it."""

import math

import pytest
import yaml

from streamrl.operator.validate import validate_job
from streamrl.planning.catalog import load_catalog
from streamrl.planning.demand import LengthDistribution
from streamrl.planning.estimates import Estimates
from streamrl.planning.planned import format_table, planned_yaml, pool_name
from streamrl.planning.planner import Links, PlanJob, Planner
from streamrl.planning.shape import ModelShape
from streamrl.spec import PipelineMode, parse_job

CATALOG = load_catalog()
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists"}
JOB = parse_job({
    "apiVersion": "streamrl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "grpo-7b"},
    "spec": {"model": {"source": "builtin-tiny"},
             "algorithm": {"promptsPerStep": 64, "groupSize": 8, "maxNewTokens": 4096, "microBatchSize": 4},
             "pipeline": {"mode": "stream-async"},
             "generators": {"pools": [{"name": "default", "replicas": 1, "threads": 2,
                                       "placement": {"tolerations": [TOLERATION]}}]}},
})


def _plan(budget: dict, mode: str = "stream-async", shape=None):
    job = PlanJob(64 * 8, 4, 4096, mode)
    workload = LengthDistribution.lognormal(math.log(800), 1.0, 4096, 256)
    planner = Planner(CATALOG, Estimates(shape or CATALOG.model("qwen2.5-7b"), job, workload), job, workload, Links())
    plan = planner.plan(budget)
    return plan, format_table(plan, "qwen2.5-7b", workload)


def test_the_planned_job_carries_the_plan_and_passes_the_clusters_checks():
    plan, table = _plan({"dc": {"H20": 16, "H800": 16}})
    text = planned_yaml(JOB, plan, table)
    assert text.startswith("# Planned by `streamrl plan`:\n")
    data = yaml.safe_load(text)
    verdict = validate_job(data, "planned.yaml")
    assert verdict.problems == ()
    spec = verdict.job.spec
    (pool,) = spec.generators.pools
    gen, train = plan.generation, plan.training
    assert pool.name == pool_name(gen.gpu.name)
    assert (pool.replicas, pool.placement.gpus, pool.engine.max_batch_size) == (gen.replicas, gen.tp, gen.max_batch)
    assert pool.placement.node_selector == gen.gpu.node_selector
    assert pool.placement.tolerations == [TOLERATION]  # the user's kept
    assert pool.threads == 2 and pool.engine.device == "cuda" and pool.cluster_ref is None
    assert spec.trainer.world_size == train.num_gpus and spec.trainer.device == "cuda"
    assert spec.trainer.placement.gpus == spec.trainer.processes_per_node
    assert spec.algorithm.max_new_tokens == 4096  # the rest of the job as the user wrote it


def test_a_plan_over_two_datacenters_places_the_generators_in_the_other_cluster():
    plan, table = _plan({"east": {"H800": 16}, "west": {"H20": 16}})
    assert (plan.generation.datacenter, plan.training.datacenter) == ("west", "east")
    data = yaml.safe_load(planned_yaml(JOB, plan, table, {"west": "dc-west"}))
    verdict = validate_job(data, "planned.yaml")
    assert verdict.problems == ()
    assert verdict.job.spec.generators.pools[0].cluster_ref == "dc-west"
    assert verdict.job.spec.trainer.service_type == "LoadBalancer"  # remote generators dial in
    assert verdict.job.spec.security.tls.secret_name == f"{verdict.job.metadata.name}-tls"  # over TLS only


def test_pool_names_are_dns_labels():
    assert pool_name("A100-80GB") == "a100-80gb"
    assert pool_name("RTX 6000 Ada") == "rtx-6000-ada"


def test_a_colocated_plan_is_written_only_where_one_process_runs_it(tiny_model_dir):
    colocated = JOB.model_copy(update={"spec": JOB.spec.model_copy(update={
        "pipeline": JOB.spec.pipeline.model_copy(update={"mode": PipelineMode.colocated})})})
    plan, table = _plan({"dc": {"H800": 8}}, mode="colocated")
    assert plan.training.num_gpus > 1
    with pytest.raises(ValueError, match=f"the plan colocates {plan.training.num_gpus} x H800, and a colocated job "
                                         "runs as one process on one device"):
        planned_yaml(colocated, plan, table)
    plan, table = _plan({"dc": {"H800": 1}}, mode="colocated", shape=ModelShape.from_hf_config(tiny_model_dir))
    verdict = validate_job(yaml.safe_load(planned_yaml(colocated, plan, table)), "planned.yaml")
    assert verdict.problems == ()
    spec = verdict.job.spec
    assert spec.pipeline.mode == "colocated" and spec.trainer.world_size == 1
    assert "switches" in table and "the GPUs both stages share" in table


def test_a_planned_tensor_parallel_trainer_is_written_and_fits_its_nodes():
    """72B PPO with a reference on 48 H800, outputs to 1,024 tokens: the trainer fits with
    checkpointing and layers split 2 ways, and the job says so."""
    job = PlanJob(1024, 1, 1024, "stream-sync")
    workload = LengthDistribution.lognormal(6.0, 1.0, 1024, 512)
    costs = Estimates(CATALOG.model("qwen2.5-72b"), job, workload, "ppo", True)
    plan = Planner(CATALOG, costs, job, workload, Links()).plan({"dc": {"H800": 48}})
    assert plan.training.memory.tensor_parallel == 2
    verdict = validate_job(yaml.safe_load(planned_yaml(JOB, plan, format_table(plan, "qwen2.5-72b", workload))),
                           "planned.yaml")
    assert verdict.problems == ()
    trainer = verdict.job.spec.trainer
    assert trainer.memory.tensor_parallel == 2 and trainer.memory.activation_checkpointing
    assert trainer.processes_per_node % 2 == 0 and trainer.world_size == plan.training.num_gpus
