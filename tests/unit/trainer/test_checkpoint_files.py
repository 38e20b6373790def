"""The checkpoint directory as files: a checkpoint counts only once its manifest is written
and renamed into place; a corrupted or half-written newest one is skipped for the one before;
one of another job is refused with what differs named; the newest `keep` are kept; every
start of the trainer is counted under one run id."""

from __future__ import annotations

import logging

import pytest

from streamrl.trainer.checkpoint import (
    MANIFEST,
    CheckpointRefused,
    Checkpoints,
    JobIdentity,
    TrainerState,
    begin_start,
)

IDENTITY = JobIdentity(model={"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 48},
                       algorithm={"groupSize": 8, "promptsPerStep": 16, "seed": 0},
                       task={"name": "counting", "seed": 0, "numPrompts": 1024, "curriculum": False})


def _save(ckpts: Checkpoints, iteration: int, identity: JobIdentity = IDENTITY) -> TrainerState:
    staging = ckpts.staging(iteration)
    (staging / "__0_0.distcp").write_bytes(bytes(range(256)) * (iteration + 1))
    (staging / ".metadata").write_bytes(b"meta")
    (staging / "rank-0.pt").write_bytes(b"rank0")
    state = TrainerState(identity=identity, run_id="r1", incarnation=0, iteration=iteration,
                         policy_version=iteration, world_size=1, time_unix=1000.0 + iteration,
                         ledger=[[f"{i}-0-3"] for i in range(iteration)], counters={"num_samples_accepted": 8})
    ckpts.complete_save(staging, state)
    return state


def test_the_newest_complete_checkpoint_is_found_and_older_ones_beyond_keep_are_deleted(tmp_path):
    ckpts = Checkpoints(tmp_path, keep=2)
    for it in (3, 6, 9):
        _save(ckpts, it)
    assert [p.name for p in ckpts.complete()] == ["iter-00009", "iter-00006"]
    path, state = ckpts.newest(IDENTITY)
    assert (path.name, state.iteration, len(state.ledger)) == ("iter-00009", 9, 9)
    assert ckpts.last.iteration == 9 and ckpts.last.path == str(path)


@pytest.mark.parametrize("damage, problem", [
    (lambda p: (p / "__0_0.distcp").write_bytes(b"flipped"), "__0_0.distcp has 7 bytes"),
    (lambda p: (p / "rank-0.pt").write_bytes(b"rankX"), "rank-0.pt does not match its checksum"),
    (lambda p: (p / ".metadata").unlink(), ".metadata is missing"),
    (lambda p: (p / MANIFEST).write_text("{not json"), "no readable manifest.json"),
])
def test_a_corrupted_newest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog, damage, problem):
    ckpts = Checkpoints(tmp_path, keep=3)
    _save(ckpts, 3)
    _save(ckpts, 6)
    damage(tmp_path / "checkpoints" / "iter-00006")
    with caplog.at_level(logging.WARNING):
        path, state = ckpts.newest(IDENTITY)
    assert (path.name, state.iteration) == ("iter-00003", 3)
    assert problem in caplog.text and "iter-00006 is unusable" in caplog.text


def test_a_half_written_checkpoint_is_never_used_and_is_cleared(tmp_path):
    ckpts = Checkpoints(tmp_path, keep=2)
    _save(ckpts, 3)
    staging = ckpts.staging(6)  # a trainer killed while writing iteration 6
    (staging / "__0_0.distcp").write_bytes(b"partial")
    assert ckpts.newest(IDENTITY)[1].iteration == 3
    ckpts.clear_staging()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["iter-00003"]


def test_a_checkpoint_of_another_job_is_refused_naming_what_differs_and_left_alone(tmp_path):
    ckpts = Checkpoints(tmp_path, keep=2)
    _save(ckpts, 3)
    other = IDENTITY.model_copy(update={"model": {**IDENTITY.model, "hidden_size": 128},
                                        "task": {**IDENTITY.task, "name": "gsm8k"}})
    with pytest.raises(CheckpointRefused) as err:
        ckpts.newest(other)
    message = str(err.value)
    assert "model.hidden_size: 64 in the checkpoint, 128 in this job" in message
    assert "task.name: 'counting' in the checkpoint, 'gsm8k' in this job" in message
    assert "--fresh" in message
    assert ckpts.problem(tmp_path / "checkpoints" / "iter-00003") is None  # untouched


def test_every_start_is_counted_under_one_run_id(tmp_path):
    ids = iter(["first", "second"])
    one = begin_start(tmp_path, lambda: next(ids))
    two = begin_start(tmp_path, lambda: next(ids))
    assert (one.run_id, one.starts) == ("first", 1)
    assert (two.run_id, two.starts) == ("first", 2)
