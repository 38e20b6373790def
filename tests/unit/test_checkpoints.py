"""The one JobIdentity (streamrl/checkpoints.py): every field that changes what a checkpoint
means changes it, no other field does, and the trainer's and the local runner's decisions,
both made from it, agree for every example job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from streamrl.checkpoints import IDENTITY_FIELDS, JobIdentity
from streamrl.local.resume import Start, decide
from streamrl.records import LOCAL_RUN_FILE, SUMMARY_FILE, LocalRun, RunSummary, TrainerPhase, write_json
from streamrl.spec import RLJob, TaskName, dump_job, load_job, parse_job
from streamrl.trainer.checkpoint import CheckpointRefused, Checkpoints, TrainerState

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "deploy" / "examples").glob("*.yaml")
                  if yaml.safe_load(p.read_text())["kind"] == "RLJob")
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 48, "rope_theta": 10000.0}


def _changed(job: RLJob, section: str, key: str) -> RLJob:
    """`job` with spec.<section>.<key> set to another valid value."""
    raw = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    value = raw["spec"][section][key]
    if key == "type":
        new = "ppo" if value == "grpo" else "grpo"
    elif key == "name":
        new = next(t.value for t in TaskName if t.value != value and t.value != "file")
    elif isinstance(value, bool):
        new = not value
    else:
        new = value + 1
    raw["spec"][section][key] = new
    return parse_job(raw)


def _fields() -> list[tuple[str, str]]:
    return [(section, key) for section, keys in IDENTITY_FIELDS.items() for key in keys]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize(("section", "key"), _fields(), ids=lambda x: x)
def test_every_identity_field_changes_the_identity(example, section, key):
    job = load_job(example)
    other = _changed(job, section, key)
    assert getattr(other.spec, section) != getattr(job.spec, section)
    assert JobIdentity.of(other, CONFIG).differences(JobIdentity.of(job, CONFIG)) == [
        f"{section}.{key}: {JobIdentity.of(job, None).model_dump()[section][key]!r} in the checkpoint, "
        f"{JobIdentity.of(other, None).model_dump()[section][key]!r} in this job"]


def test_fields_a_resume_may_change_leave_the_identity_as_it_is():
    job = load_job(EXAMPLES[0])
    raw = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["spec"]["algorithm"].update(learningRate=1e-5, numIterations=999, maxNewTokens=7, klCoef=0.5)
    raw["spec"]["pipeline"] = {"mode": "batch"}
    assert JobIdentity.of(parse_job(raw), CONFIG) == JobIdentity.of(job, CONFIG)


def test_the_model_shape_is_part_of_the_trainers_identity_only():
    job = load_job(EXAMPLES[0])
    wider = {**CONFIG, "hidden_size": 128}
    assert JobIdentity.of(job, wider).differences(JobIdentity.of(job, CONFIG)) == [
        "model.hidden_size: 64 in the checkpoint, 128 in this job"]
    assert JobIdentity.of(job, CONFIG).without_model() == JobIdentity.of(job, None)
    assert "rope_theta" not in JobIdentity.of(job, CONFIG).model  # not the shard's shape


def test_a_checkpoint_written_before_the_type_was_recorded_is_a_grpo_one():
    """Checkpoints of earlier versions hold no algorithm.type: they were GRPO's."""
    old = JobIdentity.model_validate({"model": {}, "algorithm": {"groupSize": 8, "promptsPerStep": 16, "seed": 0},
                                      "task": {"name": "counting", "seed": 0, "numPrompts": 1024,
                                               "curriculum": False}})
    grpo = parse_job({"metadata": {"name": "r"}, "spec": {"model": {"source": "builtin-tiny"}}})
    assert JobIdentity.of(grpo, None) == old
    ppo = parse_job({"metadata": {"name": "r"}, "spec": {"model": {"source": "builtin-tiny"},
                                                         "algorithm": {"type": "ppo"}}})
    assert JobIdentity.of(ppo, None).differences(old) == ["algorithm.type: 'grpo' in the checkpoint, 'ppo' in this job"]


def _finished(out: Path, job: RLJob) -> Path:
    """A finished run of `job` as the trainer and the runner leave it: a whole checkpoint of its
    last iteration (as Checkpoints writes it, with its JobIdentity), job.yaml, summary, run.json, model/."""
    checkpoints = Checkpoints(out, keep=2)
    staging = checkpoints.staging(4)
    (staging / "shard-0.pt").write_bytes(b"weights")
    checkpoints.complete_save(staging, TrainerState(
        identity=JobIdentity.of(job, CONFIG), run_id="r1", incarnation=0, iteration=4, policy_version=4,
        world_size=1, time_unix=1.0, ledger=[["p"]] * 4, counters={}))
    (out / "job.yaml").write_text(dump_job(job))
    zero = dict.fromkeys(("num_samples", "num_prompts_dispatched", "num_samples_accepted",
                          "num_samples_duplicate_dropped", "num_samples_redispatched", "num_samples_rejected",
                          "num_samples_stale_dropped", "weight_bytes_from_trainer", "weight_bytes_from_peers",
                          "policy_version"), 0)
    write_json(out / SUMMARY_FILE, RunSummary(phase=TrainerPhase.SUCCEEDED, mode="stream-sync", num_iterations=4,
                                              wall_s=1.0, train_wall_s=1.0, samples_per_s=1.0, reward_mean=0.5,
                                              pipeline_bubble_ratio=0.0, skewness_bubble_ratio=0.0, **zero))
    write_json(out / LOCAL_RUN_FILE, LocalRun(generator_replica_seconds=1.0, generator_replicas_started=1,
                                              trainer_exit_code=0))
    (out / "model").mkdir()
    (out / "model" / "config.json").write_text(json.dumps(CONFIG))
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_runner_and_the_trainer_agree_on_every_example_job(tmp_path, example):
    """The same job: the runner finds the run complete and the trainer resumes its checkpoint.
    Any identity field changed: the runner refuses the directory, and the trainer its checkpoint."""
    job = load_job(example)
    raw = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["spec"]["algorithm"]["numIterations"] = 4
    job = parse_job(raw)
    out = _finished(tmp_path / "run", job)
    assert decide(out, job).start == Start.COMPLETE
    assert Checkpoints(out, keep=2).newest(JobIdentity.of(job, CONFIG)) is not None
    for section, key in _fields():
        other = _changed(job, section, key)
        assert decide(out, other).start == Start.REFUSED, (section, key)
        with pytest.raises(CheckpointRefused, match=f"{section}.{key}"):
            Checkpoints(out, keep=2).newest(JobIdentity.of(other, CONFIG))
