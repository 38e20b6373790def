"""What `streamrl run` does with a run directory an earlier start left, from its records alone:
nothing when the run is complete for this job, continue when the job asks for more iterations,
resume when it stopped early or the records do not vouch for it, start when it holds nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrl.local.resume import Start, checkpoint_identity, decide
from streamrl.records import LOCAL_RUN_FILE, SUMMARY_FILE, LocalRun, RunSummary, TrainerPhase, write_json
from streamrl.spec import RLJob, dump_job, parse_job

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
    {"algorithm": {"promptsPerStep": 8}}, {"algorithm": {"groupSize": 2}}, {"algorithm": {"seed": 1}},
    {"task": {"numPrompts": 100}}, {"task": {"name": "addition"}}, {"task": {"curriculum": True}},
    {"model": {"source": "builtin-tiny", "warmStartSteps": 0}},
])
def test_another_jobs_run_is_neither_complete_nor_continued_the_trainer_decides(tmp_path, change):
    out = _finished_run(tmp_path, _job())
    for iterations in (TRAINED, TRAINED + 3):
        resume = decide(out, _job(iterations, **change))
        assert resume.start == Start.RESUME, change  # the trainer refuses another job's checkpoint
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


def test_the_identity_compared_is_the_trainers_for_the_algorithm_and_the_task(tmp_path):
    """A drift guard: a field the trainer's JobIdentity adds must be compared here too."""
    from streamrl.trainer.main import job_identity

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    job = _job(task={"name": "addition", "seed": 3, "numPrompts": 50, "curriculum": True},
               algorithm={"groupSize": 2, "promptsPerStep": 4, "seed": 5})
    theirs, ours = job_identity(job, tmp_path), checkpoint_identity(job)
    assert (ours["algorithm"], ours["task"]) == (theirs.algorithm, theirs.task)
