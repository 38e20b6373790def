"""A local run's plan from the job and the flags: absolute paths, processes, ports, flags refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streamrl.local.plan import plan_run
from streamrl.spec import parse_job


def _job(**spec):
    return parse_job({"metadata": {"name": "p"}, "spec": {"model": {"source": "builtin-tiny"}, **spec}})


def test_a_relative_out_is_resolved_once_against_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = plan_run(_job(), Path("runs/tiny"), False, None, lambda msg: None)
    assert plan.out_dir == tmp_path / "runs" / "tiny" and plan.out_dir.is_absolute()
    assert plan.job_file == tmp_path / "runs" / "tiny" / "job.yaml"
    assert plan.prometheus_for is None and not plan.elastic


def test_processes_ports_and_why_prometheus_starts(tmp_path):
    job = _job(generators={"pools": [{"name": "a", "replicas": 2, "maxReplicas": 3}],
                           "dispatch": {"policy": "skewness-aware"}},
               autoscaling={"mode": "Internal"})
    plan = plan_run(job, tmp_path, False, 3, lambda msg: None)
    assert list(plan.processes) == ["ranker", "trainer", "generator-a-0", "generator-a-1"]
    assert plan.processes["generator-a-1"] == {"role": "generator", "pool": "a", "replica": "a-1"}
    assert len(set(plan.admin_ports.values())) == 4 and plan.cores == 3 and plan.elastic
    assert plan.prometheus_for.startswith("spec.autoscaling.mode Internal")
    assert plan_run(job, tmp_path, True, None, lambda msg: None).prometheus_for == "--prometheus"


def test_colocated_has_no_generator_processes_and_is_not_elastic(tmp_path):
    said = []
    plan = plan_run(_job(pipeline={"mode": "colocated"}, autoscaling={"mode": "Internal"}), tmp_path, False, None,
                    said.append)
    assert list(plan.processes) == ["trainer"] and not plan.elastic and plan.prometheus_for is None
    assert "colocated mode has no generator replicas to scale" in said[0]


def test_cores_below_one_are_refused_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--cores must be at least 1, got 0"):
        plan_run(_job(), tmp_path, False, 0, lambda msg: None)


def test_the_trainer_port_is_fixed_up_front_so_a_restarted_trainer_listens_where_generators_dial(tmp_path):
    plan = plan_run(_job(), tmp_path, False, None, lambda msg: None)
    port = plan.job.spec.trainer.port
    assert 10000 <= port <= 65535 and port not in plan.admin_ports.values()
    plan.prepare()
    assert parse_job(yaml.safe_load(plan.job_file.read_text())).spec.trainer.port == port
    assert plan_run(_job(trainer={"port": 4321}), tmp_path, False, None, lambda msg: None).job.spec.trainer.port == 4321
    colocated = plan_run(_job(pipeline={"mode": "colocated"}), tmp_path, False, None, lambda msg: None)
    assert colocated.job.spec.trainer.port == 0
