"""The operator reads the trainer's /status through streamrl.records.TrainerStatus: a body
that parses is read field by field; one that does not (a renamed field: a trainer of another
version) is said to be unreadable, with the field, and never half-read."""

import logging

from streamrl.operator.observe import observe, read_trainer_status
from streamrl.operator.runtime import Runtime
from streamrl.records import TrainerPhase
from streamrl.spec import parse_job
from tests.unit.operator.trainer_bodies import body

JOB = parse_job({"metadata": {"name": "tiny"}, "spec": {"model": {"source": "builtin-tiny"}}})


class _FakeKube:
    """An API server that has none of the job's children yet."""

    async def get(self, path: str) -> None:
        return None

    async def list(self, *args, **kwargs) -> list:
        return []


def _runtime(status_body) -> Runtime:
    async def trainer_status(job, namespace):
        return status_body

    return Runtime(_FakeKube(), trainer_status=trainer_status)


def test_a_status_body_is_read_through_the_typed_model():
    status, unreadable = read_trainer_status(body(iteration=7, num_iterations=15))
    assert unreadable is None
    assert (status.phase, status.iteration, status.num_iterations, status.policy_version) == \
        (TrainerPhase.RUNNING, 7, 15, 7)
    assert status.last is not None and status.last.reward_mean == 0.5


def test_a_renamed_field_does_not_parse_and_is_named():
    renamed = body()
    renamed["version"] = renamed.pop("policy_version")
    status, unreadable = read_trainer_status(renamed)
    assert status is None
    assert unreadable == "policy_version: Field required"
    nested = body()
    nested["last"]["reward"] = nested["last"].pop("reward_mean")
    assert read_trainer_status(nested) == (None, "last.reward_mean: Field required")
    assert read_trainer_status(["not", "an", "object"])[0] is None


async def test_an_unreadable_status_reaches_the_observation_and_is_logged_once_per_change(caplog):
    renamed = body()
    renamed["version"] = renamed.pop("policy_version")
    runtime = _runtime(renamed)
    with caplog.at_level(logging.WARNING, logger="streamrl.operator"):
        first = await observe(runtime, JOB, "rl", 1, None)
        second = await observe(runtime, JOB, "rl", 1, None)
    assert first.trainer is None and first.trainer_unreadable == "policy_version: Field required"
    assert second == first
    warnings = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert warnings == ["RLJob rl/tiny: the trainer's /status is unreadable (a trainer of another version?): "
                        "policy_version: Field required"]
    # Readable again: the observation carries the status and the memory of the problem is dropped.
    runtime.trainer_status = _runtime(body(iteration=4)).trainer_status
    third = await observe(runtime, JOB, "rl", 1, None)
    assert third.trainer_unreadable is None and third.trainer.iteration == 4
    assert runtime.unreadable == {}


async def test_an_unreachable_trainer_is_neither_read_nor_unreadable():
    observed = await observe(_runtime(None), JOB, "rl", 1, None)
    assert (observed.trainer, observed.trainer_unreadable) == (None, None)
    assert observed.pools == [{"name": "default", "cluster": "", "replicas": 1, "readyReplicas": 0}]
