"""Replicas forked from `streamrl run`'s zygote behave like processes started afresh: their
exit codes (an immediate failure included), their logs, their command lines (ps, pkill -f)
and signals; and they start without repeating the zygote's imports."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from streamrl.local.children import Zygote
from tests.conftest import EXAMPLE


def _wait_for(path: Path, text: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, f"{path} never said {text!r}"
        time.sleep(0.05)


def test_forked_replicas_keep_their_exit_codes_logs_command_lines_and_signals(tmp_path):
    zygote = Zygote(tmp_path / "zygote.log", dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        ok = zygote.spawn(["validate", str(EXAMPLE)], {}, tmp_path / "ok.log")
        assert ok.wait(120) == 0 and "valid RLJob tiny-counting" in (tmp_path / "ok.log").read_text()
        # A replica that fails at once: its exit may be reported before it was handed out.
        bad = zygote.spawn(["validate", str(tmp_path / "missing.yaml")], {}, tmp_path / "bad.log")
        assert bad.wait(30) == 1 and "cannot read" in (tmp_path / "bad.log").read_text()
        # A long-running one: it shows its own command line and ends on SIGTERM like any.
        started = time.monotonic()
        ranker = zygote.spawn(["ranker", str(EXAMPLE), "--admin-port", "0"], {}, tmp_path / "ranker.log")
        _wait_for(tmp_path / "ranker.log", "ranker up")
        assert time.monotonic() - started < 10  # no interpreter start, no imports of its own
        cmdline = Path(f"/proc/{ranker.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "-m streamrl.cli ranker" in cmdline and str(EXAMPLE) in cmdline
        assert os.getsid(ranker.pid) == ranker.pid  # its own session: a terminal's Ctrl-C reaches only the runner
        assert ranker.poll() is None
        ranker.send_signal(signal.SIGTERM)
        assert ranker.wait(30) == 0 and "ranker stopped" in (tmp_path / "ranker.log").read_text()
    finally:
        zygote.close()
