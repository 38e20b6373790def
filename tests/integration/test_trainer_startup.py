"""A trainer's start (N6): its admin server answers before the model loads, /status says
`Loading` and /readyz what it waits for; a load held past trainer.startup.loadSeconds ends
the process with a line naming the field. A real trainer process whose model load is held
until a file appears (the one thing the test changes)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import child_env

HELD_LOAD = """
import sys, time
from pathlib import Path

import streamrl.models as models

release, real = Path(sys.argv.pop(1)), models.load_model


def _held_load(*args, **kw):
    while not release.exists():
        time.sleep(0.05)
    return real(*args, **kw)


models.load_model = _held_load
from streamrl.cli import main

sys.exit(main(sys.argv[1:]))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None


def test_the_trainer_answers_while_its_model_loads_and_gives_up_past_load_seconds(tmp_path, write_job,
                                                                                   tiny_model_dir):
    job = write_job({"spec": {"model": {"source": "path", "path": str(tiny_model_dir)},
                              "trainer": {"startup": {"loadSeconds": 10}}}})
    port, log = _free_port(), tmp_path / "trainer.log"
    trainer = subprocess.Popen(
        [sys.executable, "-c", HELD_LOAD, str(tmp_path / "release"), "trainer", str(job), "--model-dir",
         str(tiny_model_dir), "--out", str(tmp_path / "out"), "--admin-port", str(port)],
        env=child_env(), stdout=log.open("w"), stderr=subprocess.STDOUT)
    admin = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while (reply := _get(f"{admin}/healthz")) is None:
            assert trainer.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the admin server never answered"
            time.sleep(0.1)
        started = time.monotonic()
        assert reply.json() == {"ok": True}
        status = _get(f"{admin}/status").json()
        assert (status["phase"], status["iteration"], status["policy_version"]) == ("Loading", 0, 0)
        ready = _get(f"{admin}/readyz")
        assert ready.status_code == 503
        assert ready.json()["waiting_for"].startswith(f"the model to load from {tiny_model_dir} (")
        assert "at most 10 s" in ready.json()["waiting_for"]
        assert 'streamrl_phase{phase="Loading"} 1.0' in _get(f"{admin}/metrics").text
        # Never released: past loadSeconds the trainer gives up, naming the step and the field.
        assert trainer.wait(60) == 1
        assert time.monotonic() - started < 30
        said = log.read_text()
        assert "step Loading (the model to load from" in said and "bound of 10 s" in said
        assert "raise spec.trainer.startup.loadSeconds" in said
        assert not (tmp_path / "out" / "summary.json").exists()
    finally:
        Path(tmp_path / "release").touch()
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
