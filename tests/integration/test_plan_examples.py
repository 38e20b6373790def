"""`streamrl plan --out` on every example job, as docs/planning.md tells a user to run it: the
written job loads with the spec's own loader and carries the plan in the engine the user chose
(torch's `maxBatchSize`, vLLM's `maxNumSeqs` and `tensorParallelSize`)."""

import subprocess
import sys

import pytest
import yaml

from streamrl.planning.catalog import load_catalog
from streamrl.spec import load_job
from tests.conftest import ROOT, child_env

CATALOG = load_catalog()
EXAMPLES = sorted(p for p in (ROOT / "deploy/examples").glob("*.yaml")
                  if any(d and d.get("kind") == "RLJob" for d in yaml.safe_load_all(p.read_text())))
BUDGETS = {
    "docs": ("--model", "qwen2.5-7b", "--gpus", "H20=64,H800=32", "--lognormal", "7.3,0.8"),
    "tensor-parallel": ("--model", "qwen2.5-72b", "--gpus", "H800=128", "--lognormal", "7.3,0.8"),
}


def _generation_row(stdout: str) -> dict[str, str]:
    head = next(line for line in stdout.splitlines() if line.startswith("stage "))
    row = next(line for line in stdout.splitlines() if line.startswith("generation "))
    columns = head.replace("max batch", "max_batch").split()
    return dict(zip(columns, row.split()))


def test_every_example_is_an_rljob_and_some_use_each_engine():
    engines = {p.engine.type for path in EXAMPLES for p in load_job(path).spec.generators.pools}
    assert engines == {"torch", "vllm"}


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_the_planned_example_loads_and_keeps_its_engine(example, budget, tmp_path):
    out = tmp_path / "planned.yaml"
    done = subprocess.run([sys.executable, "-m", "streamrl.cli", "plan", str(example), *BUDGETS[budget],
                           "--out", str(out)], capture_output=True, text=True, timeout=120, env=child_env())
    assert done.returncode == 0, done.stderr
    assert f"planned job: {out}" in done.stdout
    planned, original = load_job(out), load_job(example)
    gen = _generation_row(done.stdout)
    (pool,) = planned.spec.generators.pools
    engine = pool.engine
    assert engine.type == original.spec.generators.pools[0].engine.type
    assert engine.device == "cuda"
    assert (pool.replicas, pool.placement.gpus, engine.max_batch_size) == (
        int(gen["replicas"]), int(gen["tp"]), int(gen["max_batch"]))
    if engine.type == "vllm":
        assert engine.tensor_parallel_size == int(gen["tp"])
    assert pool.placement.node_selector == CATALOG.gpu(gen["gpu"]).node_selector
    assert planned.metadata.name == original.metadata.name
    assert planned.spec.algorithm == original.spec.algorithm
