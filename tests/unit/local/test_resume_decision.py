"""What `streamrl run` does with a run directory an earlier start left, from its records alone:
nothing when the run is complete for this job, continue when the job asks for more iterations,
resume when it stopped early or the records do not vouch for it, start when it holds nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamrl.local.resume import Start, decide
from streamrl.records import LOCAL_RUN_FILE, SUMMARY_FILE, LocalRun, RunSummary, TrainerPhase, write_json
from streamrl.spec import RLJob, dump_job, parse_job
from tests.conftest import child_env

TRAINED = 4


def _job(iterations: int = TRAINED, **spec) -> RLJob:
    algorithm = {"numIterations": iterations, **spec.pop("algorithm", {})}
    return parse_job({"metadata": {"name": "r"}, "spec": {"model": {"source": "builtin-tiny"},
                                                            "algorithm": algorithm, **spec}})


def _summary(phase: TrainerPhase = TrainerPhase.SUCCEEDED, iterations: int = TRAINED) -> RunSummary:
    zero = dict.fromkeys(("num_samples", "num_prompts_dispatched", "num_samples_accepted",
                          "num_samples_duplicate_dropped", "num_samples_redispatched", "num_samples_rejected",
                          "num_samples_stale_dropped", "weight_bytes_from_trainer", "weight_bytes_from_peers",
                          "policy_version"), 0)
    return RunSummary(phase=phase, mode="stream-sync", num_iterations=iterations, wall_s=1.0, train_wall_s=1.0,
                      samples_per_s=12.5, reward_mean=0.5, pipeline_bubble_ratio=0.1, skewness_bubble_ratio=0.0,
                      reward_first=0.25, reward_last=0.75, **zero)


def _finished_run(out: Path, job: RLJob, phase: TrainerPhase = TrainerPhase.SUCCEEDED, exit_code: int = 0,
                  report: bool = False) -> Path:
    """What a run of `job` leaves: job.yaml, a checkpoint of its end, summary.json, run.json, model/."""
    (out / "checkpoints" / f"iter-{TRAINED:05d}").mkdir(parents=True)
    (out / "checkpoints" / f"iter-{TRAINED:05d}" / "manifest.json").write_text("{}")
    (out / "job.yaml").write_text(dump_job(job))
    write_json(out / SUMMARY_FILE, _summary(phase))
    write_json(out / LOCAL_RUN_FILE, LocalRun(generator_replica_seconds=1.0, generator_replicas_started=1,
                                              trainer_exit_code=exit_code))
    (out / "model").mkdir()
    (out / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    if report:
        (out / "report").mkdir()
        (out / "report" / "report.md").write_text("# run\n")
    return out


def test_a_run_complete_for_this_job_starts_nothing_and_says_where_its_results_are(tmp_path):
    out = _finished_run(tmp_path, _job(), report=True)
    resume = decide(out, _job(algorithm={"learningRate": 1e-3}))  # a field a checkpoint need not match
    assert resume.start == Start.COMPLETE
    lines = resume.message.splitlines()
    assert lines[0] == f"complete: {out} trained all {TRAINED} iterations the job asks for; nothing to start"
    assert lines[1].startswith(f"  summary: {out / SUMMARY_FILE} (0 samples, 12.5 samples/s, reward 0.250 -> 0.750")
    assert lines[2:4] == [f"  model:   {out / 'model'}", f"  report:  {out / 'report' / 'report.md'}"]


def test_a_job_asking_for_fewer_iterations_than_trained_is_complete_too(tmp_path):
    resume = decide(_finished_run(tmp_path, _job()), _job(iterations=2))
    assert resume.start == Start.COMPLETE
    assert f"trained {TRAINED} iterations, more than the 2 the job asks for" in resume.message
    assert "report:" not in resume.message  # none written


def test_more_iterations_continue_from_the_last_checkpoint_and_say_so(tmp_path):
    resume = decide(_finished_run(tmp_path, _job()), _job(iterations=7))
    assert resume.start == Start.CONTINUE
    assert resume.message.startswith(f"continuing {tmp_path}: it trained {TRAINED} iterations, the job now asks "
                                     f"for 7 (from iter-{TRAINED:05d};")


@pytest.mark.parametrize("change", [
    {"algorithm": {"type": "ppo"}}, {"algorithm": {"promptsPerStep": 8}}, {"algorithm": {"groupSize": 2}},
    {"algorithm": {"seed": 1}}, {"task": {"numPrompts": 100}}, {"task": {"name": "addition"}},
    {"task": {"curriculum": True}},
])
def test_another_jobs_run_is_refused_complete_or_not(tmp_path, change):
    out = _finished_run(tmp_path, _job())
    for iterations in (TRAINED, TRAINED + 3):
        resume = decide(out, _job(iterations, **change))
        assert resume.start == Start.REFUSED, change  # the trainer would refuse its checkpoints
        (section, fields), = change.items()
        (key, value), = fields.items()
        assert f"  {section}.{key}: " in resume.message and f"{value!r} in this job" in resume.message


def test_a_run_of_another_model_spec_is_not_complete_the_trainer_decides(tmp_path):
    """The model's shape only its files tell: the trainer compares it, and refuses another shape."""
    out = _finished_run(tmp_path, _job())
    for iterations in (TRAINED, TRAINED + 3):
        resume = decide(out, _job(iterations, model={"source": "builtin-tiny", "warmStartSteps": 0}))
        assert resume.start == Start.RESUME
        assert resume.message.startswith(f"resuming: {out} holds checkpoints up to iter-{TRAINED:05d}")


@pytest.mark.parametrize("phase", [TrainerPhase.PREEMPTED, TrainerPhase.INTERRUPTED, TrainerPhase.FAILED])
def test_a_run_that_stopped_early_resumes(tmp_path, phase):
    assert decide(_finished_run(tmp_path, _job(), phase=phase), _job()).start == Start.RESUME


def test_records_that_do_not_vouch_for_the_run_leave_it_to_the_trainer(tmp_path):
    out = _finished_run(tmp_path, _job(), exit_code=1)  # e.g. a later start the trainer refused
    assert decide(out, _job()).start == Start.RESUME
    (out / LOCAL_RUN_FILE).unlink()  # a start that never reached its end
    assert decide(out, _job()).start == Start.RESUME
    write_json(out / LOCAL_RUN_FILE, LocalRun(generator_replica_seconds=1.0, generator_replicas_started=1,
                                              trainer_exit_code=0))
    (out / SUMMARY_FILE).write_text('{"phase": "Succeeded"}')  # another version's summary
    assert decide(out, _job()).start == Start.RESUME


def test_a_complete_run_without_its_final_model_resumes_to_write_it(tmp_path):
    out = _finished_run(tmp_path, _job())
    (out / "model" / "config.json").unlink()
    assert decide(out, _job()).start == Start.RESUME


def test_an_empty_or_missing_directory_starts_new(tmp_path):
    assert decide(tmp_path, _job()).start == Start.NEW
    assert decide(tmp_path / "absent", _job()).start == Start.NEW


def test_a_finished_grpo_run_is_refused_to_a_ppo_job_and_kept_as_it_is(tmp_path):
    """The same file switched to algorithm.type ppo: a PPO checkpoint holds a critic, a GRPO one
    none, so the trainer would refuse this directory's checkpoints; the runner says so first."""
    out = _finished_run(tmp_path, _job())
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    resume = decide(out, _job(algorithm={"type": "ppo"}))
    assert resume.start == Start.REFUSED
    lines = resume.message.splitlines()
    assert lines[0].startswith(f"refused: {out} holds the checkpoints (up to iter-{TRAINED:05d}) of another job")
    assert lines[1] == "  algorithm.type: 'grpo' in the earlier job, 'ppo' in this job"
    assert "--fresh" in lines[-1]
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_a_run_stopped_early_of_another_task_is_refused_too(tmp_path):
    out = _finished_run(tmp_path, _job(), phase=TrainerPhase.INTERRUPTED)
    resume = decide(out, _job(task={"name": "addition"}))
    assert resume.start == Start.REFUSED
    assert "  task.name: 'counting' in the earlier job, 'addition' in this job" in resume.message.splitlines()


def test_streamrl_run_refuses_a_ppo_job_in_a_grpo_runs_directory_before_starting_anything(tmp_path):
    """The user's path: `streamrl run ppo.yaml --out <a finished GRPO run>` exits 78 (a job error,
    as the trainer's refusal would) with the reason, and leaves the directory as it was."""
    out = _finished_run(tmp_path / "run", _job())
    job_file = tmp_path / "ppo.yaml"
    job_file.write_text(dump_job(_job(algorithm={"type": "ppo"})))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    done = subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(job_file), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env=child_env())
    assert done.returncode == 78, done.stderr
    assert f"refused: {out} holds the checkpoints" in done.stderr
    assert "algorithm.type: 'grpo' in the earlier job, 'ppo' in this job" in done.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before

