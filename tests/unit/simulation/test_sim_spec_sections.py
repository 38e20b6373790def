"""A scenario's `pipeline`, `dispatch` and `autoscaling` are the RLJob's sections, unchanged:
every such section the repository shows (its RLJobs, its scenarios, the docs' examples) and
stepped autoscaling is accepted by both, as the same model with the same fields set."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamrl.cli import main
from streamrl.simulation.scenario import load_scenario
from streamrl.spec import API_VERSION, SpecModel, parse_job

ROOT = Path(__file__).resolve().parents[3]
ABSENT = "(absent)"
"""Stands for a file that leaves the section out (each side's default)."""


def _documents() -> list[tuple[str, dict]]:
    """(where, the job's spec or a scenario) for every RLJob and scenario under deploy/ and every
    YAML example in docs/."""
    out = []
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "RLJob":
                out.append((str(path.relative_to(ROOT)), doc["spec"]))
            elif isinstance(doc, dict) and path.parent.name == "scenarios":
                out.append((str(path.relative_to(ROOT)), doc))
    for path in sorted((ROOT / "docs").glob("*.md")):
        for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S):
            try:
                doc = yaml.safe_load(block)
            except yaml.YAMLError:
                continue  # a fragment with "..." in it
            if isinstance(doc, dict):
                out.append((str(path.relative_to(ROOT)), doc.get("spec", doc)))
    return out


def _sections(name: str, extra: list[Any]) -> list[tuple[str, Any]]:
    """Every distinct `name` section the repository shows, then `extra`."""
    found: dict[str, tuple[str, Any]] = {}
    for where, doc in _documents():
        generators = doc.get("generators")
        # a job's dispatch is generators.dispatch, a scenario's (whose generators are a list) top level
        section = generators.get(name) if name == "dispatch" and isinstance(generators, dict) else doc.get(name)
        if isinstance(section, dict) and not (name == "dispatch" and section.get("policy") == "oracle"
                                              and "oracleLengths" not in section):  # a scenario's own oracle
            found.setdefault(repr(section), (where, section))
    for section in [ABSENT, *extra]:
        found.setdefault(repr(section), ("stepped" if name == "autoscaling" else "extra", section))
    return list(found.values())


AUTOSCALING = _sections("autoscaling", [
    {"mode": "External"},  # deploy/examples/keda-scaledobject.yaml's comment
    {"mode": "Internal", "step": 2},
    {"mode": "Internal", "step": 4, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}}},
    {"mode": "Internal", "step": 2, "behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 2}]}}},
])
PIPELINE = _sections("pipeline", [{"mode": "stream-async", "maxStaleness": 2, "inFlightUpdates": True}])
DISPATCH = _sections("dispatch", [{"policy": "oracle", "oracleLengths": "lengths.jsonl"}])


def _scenario(**sections: Any) -> dict:
    return {
        "name": "t",
        "workload": {"promptTokens": 16, "maxNewTokens": 64, "lengths": {"type": "lognormal", "median": 20}},
        "trainer": {"cost": {"type": "table", "secondsPerToken": 1e-4}},
        "generators": [{"name": "g", "replicas": 2, "maxReplicas": 8,
                        "cost": {"type": "table", "decodeStepSeconds": [[1, 0.01]], "maxBatchSize": 16}}],
        "weights": {"sizeBytes": 1e6},
        **{k: v for k, v in sections.items() if v != ABSENT},
    }


def _set_fields(model: SpecModel) -> dict:
    """What the file set, recursively: a default read as set shows here."""
    return model.model_dump(by_alias=True, exclude_unset=True)


def _both(tmp_path: Path, name: str, section: Any) -> tuple[SpecModel, SpecModel]:
    """The section as an RLJob reads it and as `streamrl simulate --iterations 1` reads it."""
    spec: dict[str, Any] = {"model": {"source": "builtin-tiny"}}
    if section != ABSENT:
        spec.update({"generators": {"dispatch": section}} if name == "dispatch" else {name: section})
    job = parse_job({"apiVersion": API_VERSION, "kind": "RLJob", "spec": spec}).spec
    from_job = job.generators.dispatch if name == "dispatch" else getattr(job, name)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(_scenario(**{name: section})))
    return from_job, getattr(load_scenario(path, iterations=1), name)


@pytest.mark.parametrize(("where", "section"), AUTOSCALING, ids=[w for w, _ in AUTOSCALING])
def test_an_autoscaling_section_reads_the_same_in_a_job_and_a_scenario(tmp_path, where, section):
    from_job, from_scenario = _both(tmp_path, "autoscaling", section)
    assert from_scenario == from_job
    assert _set_fields(from_scenario) == _set_fields(from_job)


@pytest.mark.parametrize(("where", "section"), PIPELINE, ids=[w for w, _ in PIPELINE])
def test_a_pipeline_section_reads_the_same_in_a_job_and_a_scenario(tmp_path, where, section):
    from_job, from_scenario = _both(tmp_path, "pipeline", section)
    assert from_scenario == from_job
    assert _set_fields(from_scenario) == _set_fields(from_job)


@pytest.mark.parametrize(("where", "section"), DISPATCH, ids=[w for w, _ in DISPATCH])
def test_a_dispatch_section_reads_the_same_in_a_job_and_a_scenario(tmp_path, where, section):
    from_job, from_scenario = _both(tmp_path, "dispatch", section)
    assert from_scenario == from_job
    assert _set_fields(from_scenario) == _set_fields(from_job)


def test_the_repository_shows_sections_to_compare():
    assert {w for w, _ in PIPELINE} >= {"deploy/examples/rljob-heterogeneous.yaml",
                                        "deploy/scenarios/two-replicas.yaml"}
    assert any(w.startswith("deploy/examples/") for w, _ in DISPATCH)
    assert {w for w, _ in AUTOSCALING} >= {"deploy/scenarios/qwen2.5-72b-elastic.yaml", "docs/scaling.md"}


def test_stepped_autoscaling_simulates_with_every_flag(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(_scenario(autoscaling={"mode": "Internal", "step": 2})))
    assert main(["simulate", str(path), "--mode", "stream-async", "--policy", "random-fifo",
                 "--iterations", "2"]) == 0


def test_a_flag_replaces_the_key_however_the_file_spells_it(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(_scenario(algorithm={"num_iterations": 7}, dispatch={"policy": "oracle"})))
    scenario = load_scenario(path, policy="random-fifo", iterations=2)
    assert scenario.algorithm.num_iterations == 2
    assert scenario.dispatch.policy == "random-fifo" and scenario.dispatch.oracle_lengths is None
