"""`streamrl run` of a job whose model is a Hugging Face Hub repository, resolved offline in a
hub cache by the real huggingface_hub code: the trainer loads it once and the generators boot
from the trainer; a repository the cache lacks stops the run before anything starts, naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamrl.records import RunSummary
from tests.conftest import child_env
from tests.hfcache import cache_model

pytestmark = pytest.mark.slow


def _run(tmp_path, job, out):
    env = dict(child_env(), HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_a_job_with_an_hf_model_runs_end_to_end_from_the_hub_cache(tmp_path, write_job, tiny_model_dir):
    cache_model(tiny_model_dir, tmp_path / "hub", "streamrl-test/tiny", ("v1",))
    job = write_job({"spec": {
        "model": {"source": "hf", "hf": {"repo": "streamrl-test/tiny", "revision": "v1"}},
        "algorithm": {"numIterations": 3, "promptsPerStep": 8, "groupSize": 4, "maxNewTokens": 24},
    }})
    proc = _run(tmp_path, job, tmp_path / "run")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = RunSummary.read(tmp_path / "run" / "summary.json")
    assert summary.phase == "Succeeded" and summary.num_iterations == 3
    generator_log = (tmp_path / "run" / "logs" / "generator-default-0.log").read_text()
    assert "booting from the trainer" in generator_log


def test_an_hf_repository_not_in_the_cache_is_named_and_nothing_starts(tmp_path, write_job):
    (tmp_path / "hub").mkdir()
    job = write_job({"spec": {"model": {"source": "hf", "hf": {"repo": "streamrl-test/absent"}}}})
    proc = _run(tmp_path, job, tmp_path / "run")
    assert proc.returncode != 0
    assert "model.hf streamrl-test/absent@main: not in the Hugging Face cache" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run" / "logs").exists()
