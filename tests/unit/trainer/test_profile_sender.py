"""The replica's end of the stream `streamrl profile` measures: the samples it sends, its
refusals, and the profile giving up loudly when it cannot run (the measurement over a real
stream is tests/integration/test_profile_cli.py's)."""

import asyncio
import sys

import pytest

from streamrl.messages import Work
from streamrl.trainer import profile
from streamrl.trainer.profile_sender import main, profile_sample


def test_a_sample_answers_its_work_as_a_replica_would():
    work = Work("7-3-3", (5, 6, 7), (0, 1), 0.9, 1.0, 12, 3, min_policy_version=4, incarnation=2)
    sample = profile_sample(work, 1, 5, "r-0")
    assert (sample.prompt_id, sample.sample_index, sample.generator_id) == ("7-3-3", 1, "r-0")
    assert (sample.policy_version, sample.incarnation, sample.finish_reason) == (4, 2, "length")
    assert sample.completion_token_ids == (5, 6, 7, 8, 9) and sample.logprobs == (-1.0,) * 5


@pytest.mark.parametrize("flag", ["--per-round", "--burst", "--completion-tokens", "--capacity"])
def test_a_count_below_one_is_refused_naming_its_flag(flag, capsys):
    argv = ["127.0.0.1:1", "--per-round", "8", "--completion-tokens", "4", "--capacity", "8", flag, "0"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert f"{flag} must be >= 1 (got 0)" in capsys.readouterr().err


class _FakeCoordinator:
    """Never sees a replica connect."""

    async def wait_for_generators(self, num: int = 1) -> None:
        await asyncio.Event().wait()


def test_a_sender_that_exits_before_connecting_fails_the_profile_with_its_stderr():
    async def go():
        sender = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; sys.exit('no route to the servicer')",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        await profile._connected(_FakeCoordinator(), sender)

    with pytest.raises(RuntimeError, match="exited with 1:\nno route to the servicer"):
        asyncio.run(go())


def test_a_sender_that_never_connects_fails_the_profile_after_the_timeout(monkeypatch):
    monkeypatch.setattr(profile, "SENDER_TIMEOUT_S", 0.5)

    async def go():
        sender = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(30)",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            await profile._connected(_FakeCoordinator(), sender)
        finally:
            sender.kill()
            await sender.wait()

    with pytest.raises(RuntimeError, match="did not connect within 0 s"):
        asyncio.run(go())
