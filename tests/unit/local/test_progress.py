"""The progress bar reads the trainer's /status through TrainerStatus: a body with a renamed
field fails there, and a trainer on its way out is simply not shown."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from streamrl.local.progress import _status

STATUS = {"run_id": "r", "phase": "Running", "mode": "stream-sync", "iteration": 3, "num_iterations": 10,
          "policy_version": 3, "num_samples_accepted": 96, "samples_per_s": 12.5, "uptime_s": 9.0}


def _client(code: int, body: dict) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(code, json=body)))


def test_status_is_parsed_into_the_typed_model():
    status = _status(_client(200, STATUS), "http://t/status")
    assert status.iteration == 3 and status.samples_per_s == 12.5 and status.last is None


def test_a_renamed_field_fails_where_it_is_read():
    body = {**STATUS, "iterations_done": STATUS["iteration"]}
    del body["iteration"]
    with pytest.raises(ValidationError, match="iteration"):
        _status(_client(200, body), "http://t/status")


def test_a_trainer_that_does_not_answer_is_not_shown():
    assert _status(_client(503, {}), "http://t/status") is None

    def refuse(request):
        raise httpx.ConnectError("refused")

    assert _status(httpx.Client(transport=httpx.MockTransport(refuse)), "http://t/status") is None
