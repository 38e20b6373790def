"""`streamrl run --prometheus` without a Prometheus binary: a clear message, nothing started."""

import subprocess
import sys
from pathlib import Path

from tests.conftest import EXAMPLE, child_env


def test_missing_prometheus_binary_is_named_and_nothing_starts(tmp_path):
    empty = tmp_path / "bin"  # a PATH without prometheus
    empty.mkdir()
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(EXAMPLE), "--out", str(out),
                           "--prometheus"], env={**child_env(), "PATH": str(empty)}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "--prometheus: no `prometheus` binary on PATH" in proc.stderr
    assert "apt-get install prometheus" in proc.stderr
    assert not (out / "trainer.json").exists() and not (out / "logs").exists()


def test_local_prometheus_scrapes_a_target_and_stops(tmp_path):
    """The server class itself: starts on loopback, loads the rules, scrapes a target, stops."""
    import time

    from prometheus_client import CollectorRegistry, Counter, start_http_server

    from streamrl.local.ports import free_port
    from streamrl.local.prometheus import LocalPrometheus, Target

    registry = CollectorRegistry()
    Counter("streamrl_generated_tokens", "test", registry=registry).inc(42)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    prom = LocalPrometheus(tmp_path / "prom", scrape_interval_s=0.5)
    prom.set_targets([Target(f"127.0.0.1:{port}", {"rljob": "t", "role": "generator"})])
    url = prom.start()
    try:
        assert url.startswith("http://127.0.0.1:")
        deadline = time.monotonic() + 30
        while not (got := prom.query('streamrl_generated_tokens_total{rljob="t", role="generator"}')):
            assert time.monotonic() < deadline, "never scraped"
            time.sleep(0.5)
        assert float(got[0]["value"][1]) == 42.0
        rules = __import__("httpx").get(f"{url}/api/v1/rules").json()["data"]["groups"]
        assert {g["name"] for g in rules} == {"streamrl.bubbles", "streamrl.scaling", "streamrl.alerts"}
    finally:
        prom.stop()
        server.shutdown()
    assert prom.proc.returncode == 0
    assert Path(tmp_path / "prom" / "data").is_dir()
