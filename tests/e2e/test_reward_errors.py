"""A reward function that raises on some completions (reward.onError): the run never hangs
and never loses the sample. `fail` stops it at once (no restart: the same completion would
raise again) with the function, the prompt and the error named; `zero` scores those samples
0, counts them and trains on every sample once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamrl.records import EVENTS_FILE, RunEvent, RunSummary
from tests.conftest import child_env

pytestmark = pytest.mark.slow

FLAKY = '''
def score(completion: str, answer: str) -> float:
    if len(completion) % 3 == 0:
        raise ValueError(f"cannot score {completion[:8]!r}")
    return float(completion.strip() == answer.strip())
'''

ITERATIONS, PROMPTS, GROUP = 3, 8, 4


def _run(tmp_path, write_job, tiny_model_dir, on_error: str) -> tuple[subprocess.CompletedProcess, object]:
    (tmp_path / "flaky_reward.py").write_text(FLAKY)
    job = write_job({"spec": {
        "model": {"source": "path", "path": str(tiny_model_dir)},
        "reward": {"function": "flaky_reward:score", "onError": on_error},
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": PROMPTS, "groupSize": GROUP,
                      "maxNewTokens": 24},
    }})
    out = tmp_path / "run"
    env = dict(child_env(), PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job), "--out", str(out), "--quiet"],
                          env=env, capture_output=True, text=True, timeout=300)
    return proc, out


def test_a_raising_reward_fails_the_run_with_the_error_named(tmp_path, write_job, tiny_model_dir):
    proc, out = _run(tmp_path, write_job, tiny_model_dir, "fail")
    assert proc.returncode != 0
    trainer_log = (out / "logs" / "trainer.log").read_text()
    assert "reward.function 'flaky_reward:score' raised on prompt" in trainer_log
    assert "ValueError: cannot score" in trainer_log and "reward.onError fail" in trainer_log
    assert "reward.function 'flaky_reward:score' raised" in proc.stderr  # the runner shows the trainer's end
    # The same completion would raise again: no restart is spent on it.
    assert "trainer exited with 78: the job's own code or files failed in a way every start repeats; not restarted" \
        in proc.stderr
    assert trainer_log.count("starting (start 1 of its run)") == 1 and "start 2 of its run" not in trainer_log
    events = RunEvent.read_lines(out / EVENTS_FILE)
    assert [(e.kind, e.process, e.detail) for e in events if e.process == "trainer"] == [("died", "trainer", "exit 78")]
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == "Failed" and summary.num_iterations < ITERATIONS


def test_a_raising_reward_scores_zero_when_asked_and_every_sample_is_trained_once(tmp_path, write_job,
                                                                                   tiny_model_dir):
    proc, out = _run(tmp_path, write_job, tiny_model_dir, "zero")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == "Succeeded" and summary.num_iterations == ITERATIONS
    assert summary.num_samples_accepted == ITERATIONS * PROMPTS * GROUP
    assert summary.num_samples_duplicate_dropped == 0
    assert summary.num_samples_reward_failed > 0
