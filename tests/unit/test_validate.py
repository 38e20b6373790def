"""`streamrl validate`: every example passes, every job the CRD tests refuse is refused with its
field named, a job without a model is refused, and --show-defaults resolves the defaults."""

import io
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamrl.operator.crd import rljob_crd
from streamrl.operator.validate import run, validate_file, validate_job
from tests.unit.operator.test_crd import INVALID

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))
CRD = rljob_crd()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamrl.cli", "validate", *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def _field(message: str) -> str:
    """The field an INVALID entry of the CRD tests names ("generators.pools[0].name: ..." -> spec.generators...)."""
    return "spec." + message.split(": ")[0]


def _write(tmp_path: Path, name: str, obj) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(obj))
    return path


def test_every_example_is_valid_and_other_kinds_are_skipped():
    done = _cli(*EXAMPLES)
    assert done.returncode == 0, done.stdout + done.stderr
    for path in EXAMPLES:
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] == "RLJob":
            assert f"{path}: valid RLJob {doc['metadata']['name']}\n" in done.stdout
        else:
            assert f"{path}: skipped: not an RLJob ({doc['apiVersion']} {doc['kind']})" in done.stdout
    assert sum(yaml.safe_load(p.read_text())["kind"] == "RLJob" for p in EXAMPLES) >= 3


@pytest.mark.parametrize("obj, message", INVALID, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(INVALID)])
def test_every_job_the_crd_refuses_is_refused_with_its_field_named(obj, message, tmp_path):
    verdict = validate_job(obj, "job.yaml", CRD)
    assert verdict.job is None
    assert _field(message) in [where for where, _ in verdict.problems], verdict.problems
    path, out = _write(tmp_path, "job.yaml", obj), io.StringIO()
    assert run([str(path)], False, out) == 1
    assert f"{path}: {_field(message)}: " in out.getvalue()


def test_the_command_prints_each_problem_with_file_and_field_and_exits_non_zero(tmp_path):
    picked = [INVALID[0], INVALID[2], INVALID[5], INVALID[8], INVALID[-3]]  # schema, unknown field, CEL x2, nested
    files = [_write(tmp_path, f"bad-{i}.yaml", obj) for i, (obj, _) in enumerate(picked)]
    done = _cli(EXAMPLES[-1], *files)
    assert done.returncode == 1, done.stdout + done.stderr
    for path, (_, message) in zip(files, picked):
        assert f"{path}: {_field(message)}: " in done.stdout
    assert f"{EXAMPLES[-1]}: valid RLJob" in done.stdout  # the valid one is still said to be valid


def test_a_job_without_a_model_is_refused_naming_spec_model(tmp_path):
    job = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    del job["spec"]["model"]
    path = _write(tmp_path, "no-model.yaml", job)
    done = _cli(path)
    assert done.returncode == 1
    assert done.stdout == (f"{path}: spec.model: required: a job must say what it trains "
                           "(e.g. `model: {source: builtin-tiny}`)\n")


def test_show_defaults_prints_the_job_resolved():
    example = ROOT / "deploy/examples/rljob-tiny-cpu.yaml"
    assert "clipEpsHigh" not in example.read_text() and "onError" not in example.read_text()
    done = _cli("--show-defaults", example)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"---\n# {example}: valid RLJob tiny-counting, every default resolved\n")
    [job] = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert job["spec"]["algorithm"]["clipEpsHigh"] == 0.28          # only a default
    assert job["spec"]["trainer"]["weightChunkBytes"] == 1 << 20    # only a default
    assert job["spec"]["algorithm"]["numIterations"] == 15          # the file's own value


def test_file_level_problems_and_several_documents(tmp_path):
    out = io.StringIO()
    assert run([str(tmp_path / "missing.yaml")], False, out) == 1
    assert out.getvalue() == f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory\n"
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed")
    [verdict] = validate_file(broken, CRD)
    assert verdict.problems[0][1].startswith("not valid YAML")
    good = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    bad = {**good, "spec": {**good["spec"], "suspend": "yes"}}
    several = tmp_path / "several.yaml"
    several.write_text(yaml.safe_dump_all([good, {"apiVersion": "v1", "kind": "ConfigMap"}, bad]))
    out = io.StringIO()
    assert run([str(several)], False, out) == 1
    assert out.getvalue().splitlines() == [
        f"{several} (document 1): valid RLJob tiny-counting",
        f"{several} (document 2): skipped: not an RLJob (v1 ConfigMap)",
        f"{several} (document 3): spec.suspend: Input should be a valid boolean",
    ]


def test_a_vllm_engine_argument_vllm_lacks_is_refused_by_name(tmp_path):
    job = yaml.safe_load((ROOT / "deploy/examples/rljob-tiny-cpu.yaml").read_text())
    job["spec"]["generators"]["pools"][0]["engine"] = {"type": "vllm", "device": "cpu",
                                                       "engineArgs": {"max_num_batched_tokens": 4096,
                                                                      "max_num_seqz": 8}}
    out = io.StringIO()
    assert run([str(_write(tmp_path, "vllm.yaml", job))], False, out) == 1
    assert out.getvalue() == (f"{tmp_path / 'vllm.yaml'}: spec.generators.pools[0].engine.engineArgs.max_num_seqz: "
                              "not an argument of the installed vLLM's EngineArgs (names are vLLM's, snake_case, "
                              "e.g. max_num_batched_tokens)\n")
