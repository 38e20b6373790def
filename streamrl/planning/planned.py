"""What `streamrl plan` hands back: the plan as a table, and the job with the plan written into
it (the generator pool's GPU type, tensor-parallel GPUs and replicas; the trainer's nodes and
ranks; the remote datacenter's clusterRef), checked by the spec model like any job file."""

from __future__ import annotations

import re

import yaml

from streamrl.planning.demand import LengthDistribution
from streamrl.planning.planner import Plan, StagePlan
from streamrl.spec import RLJob, parse_job


def format_table(plan: Plan, model: str, workload: LengthDistribution) -> str:
    """The plan for a person: one row per stage, then the iteration's totals."""
    head = (f"{model}; {plan.samples_per_iteration} samples per iteration; {plan.mode}; "
            f"objective {'iteration time' if plan.objective == 'time' else 'samples/s per cost'}\n"
            f"workload {workload.describe()}\n")
    columns = ("stage", "datacenter", "gpu", "gpus", "tp", "replicas", "max batch", "seconds", "utilisation", "cost",
               "source")
    rows = [columns] + [_row(plan, s) for s in (plan.generation, plan.training)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    lines = ["  ".join(cell.rjust(w) if i in range(3, 10) else cell.ljust(w) for i, (cell, w) in
                       enumerate(zip(r, widths))).rstrip() for r in rows]
    moved = (f"switches {plan.to_training_s + plan.to_generation_s:.2f} s: to training {plan.to_training_s:.2f}, "
             f"to generation {plan.to_generation_s:.2f}" if plan.colocated else
             f"weight transfer {plan.weight_sync_s:.2f} s")
    tail = (f"iteration {plan.iteration_s:.2f} s ({moved}), "
            f"{plan.samples_per_s:.1f} samples/s, cost {plan.cost:.2f} per unit time"
            f"{' (the GPUs both stages share)' if plan.colocated else ''}, "
            f"{plan.samples_per_s_per_cost:.3f} samples/s per cost")
    released = "; ".join(f"{dc}: " + ", ".join(f"{n} x {t}" for t, n in types.items())
                         for dc, types in plan.released.items())
    memory = plan.training.memory.names() if plan.training.memory else []
    if memory:
        why = f" (without them: {plan.training.memory_reason})" if plan.training.memory_reason else ""
        tail += f"\ntrainer memory: {', '.join(memory)}{why}"
    return head + "\n" + "\n".join(lines) + "\n\n" + tail + (f"\nreleased (not needed): {released}" if released else "")


def _row(plan: Plan, s: StagePlan) -> tuple[str, ...]:
    gen = s.stage == "generation"
    return (s.stage, s.datacenter, s.gpu.name, str(s.num_gpus), str(s.tp) if gen else "-",
            str(s.replicas) if gen else "-", str(s.max_batch) if gen else "-", f"{s.seconds:.2f}",
            f"{plan.utilisation(s):.0%}", f"{s.cost:.2f}", s.source)


def pool_name(gpu_name: str) -> str:
    """A DNS-label pool name from a GPU type (`A100-80GB` -> `a100-80gb`)."""
    return re.sub(r"[^a-z0-9-]+", "-", gpu_name.lower()).strip("-")[:40] or "pool"


def planned_job(job: RLJob, plan: Plan, cluster_refs: dict[str, str] | None = None) -> RLJob:
    """`job` with the plan filled in: one generator pool (the job's first pool's settings kept,
    its GPU type, GPUs per replica = tensor-parallel size, replicas and engine batch replaced),
    the trainer's nodes, ranks per node and GPUs; with two datacenters the generators' one is
    the pool's clusterRef (`cluster_refs` maps a datacenter to its RLCluster; default its name),
    the trainer behind a LoadBalancer and, unless the job names its own, mutual TLS from the
    Secret `<name>-tls`."""
    gen, train = plan.generation, plan.training
    if plan.colocated and train.num_gpus > 1:
        raise ValueError(f"the plan colocates {train.num_gpus} x {train.gpu.name}, and a colocated job runs as one "
                         "process on one device (spec.pipeline.mode colocated): plan it as batch, stream-sync or "
                         "stream-async to write the job, or with --gpus of one GPU")
    data = job.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)
    spec = data["spec"]
    generators = spec.setdefault("generators", {})
    template = dict((generators.get("pools") or [{}])[0])
    pool = {**template, "name": pool_name(gen.gpu.name), "replicas": gen.replicas,
            "engine": _engine(template.get("engine", {}), gen),
            "placement": {**template.get("placement", {}), "nodeSelector": dict(gen.gpu.node_selector),
                          "gpus": gen.tp},
            "cost": round(gen.tp * gen.gpu.relative_cost, 6)}
    pool.pop("clusterRef", None)
    if gen.datacenter != train.datacenter:
        pool["clusterRef"] = (cluster_refs or {}).get(gen.datacenter, gen.datacenter)
    if pool.get("maxReplicas") is not None and pool["maxReplicas"] < gen.replicas:
        pool.pop("maxReplicas")
    generators["pools"] = [pool]
    generators.pop("replicas", None)
    per_node = min(train.num_gpus, train.gpu.gpus_per_node)
    trainer = spec.setdefault("trainer", {})
    trainer.update(device="cuda", nodes=train.num_gpus // per_node, processesPerNode=per_node,
                   placement={**trainer.get("placement", {}), "nodeSelector": dict(train.gpu.node_selector),
                              "gpus": per_node})
    if train.memory and train.memory.names():  # as priced: the job's own features and those it needs to fit
        chosen = {"activationCheckpointing": train.memory.activation_checkpointing,
                  "cpuOffload": train.memory.cpu_offload}
        trainer["memory"] = {**trainer.get("memory", {}), **{k: True for k, on in chosen.items() if on}}
        if train.memory.tensor_parallel > 1:
            trainer["memory"]["tensorParallel"] = train.memory.tensor_parallel
    if pool.get("clusterRef") and trainer.get("serviceType", "ClusterIP") == "ClusterIP":
        trainer["serviceType"] = "LoadBalancer"  # the remote pool dials in from another cluster
    if trainer.get("serviceType", "ClusterIP") != "ClusterIP" and not (spec.get("security") or {}).get("tls"):
        # beyond the cluster only over TLS: a Secret (ca.crt, tls.crt, tls.key) to create in both clusters
        spec.setdefault("security", {})["tls"] = {"secretName": f"{job.metadata.name}-tls"}
    trainer["minGenerators"] = min(trainer.get("minGenerators", 1), gen.replicas)
    return parse_job(data, "planned job")


def _engine(engine: dict, gen: StagePlan) -> dict:
    """The pool's engine as planned: the user's engine kept (torch when the pool names none), on
    cuda, its batch cap the planned max batch under the engine's own name for it (torch
    `maxBatchSize`, vLLM `maxNumSeqs`); a vLLM replica shards over the planned tensor-parallel
    GPUs (the torch engine has no tensor parallelism: one replica, `placement.gpus` GPUs)."""
    engine = {"type": "torch", **engine, "device": "cuda"}
    if engine["type"] == "vllm":
        return {**engine, "maxNumSeqs": gen.max_batch, "tensorParallelSize": gen.tp}
    return {**engine, "maxBatchSize": gen.max_batch}


def planned_yaml(job: RLJob, plan: Plan, table: str, cluster_refs: dict[str, str] | None = None) -> str:
    """The planned job as YAML, the plan's table above it as comments."""
    header = "".join(f"# {line}".rstrip() + "\n" for line in ["Planned by `streamrl plan`:", ""] + table.splitlines())
    planned = planned_job(job, plan, cluster_refs)  # what the user set and what the plan set; defaults stay implicit
    data = planned.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)
    return header + yaml.safe_dump(data, sort_keys=False)
