"""A Prometheus server for one local run: loopback only, StreamRL's rules loaded, targets
from a file the runner rewrites as processes come and go (file-based service discovery,
so replicas added or removed later are picked up without a restart). Every path it is
handed is absolute: Prometheus resolves a relative one against its config's folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from streamrl.local.ports import free_port
from streamrl.prometheus import RULES_FILE
from streamrl.prometheus.api import PrometheusAPI, PrometheusError

MISSING = ("no `prometheus` binary on PATH: install Debian's prometheus package (apt-get install prometheus) "
           "or put a release from prometheus.io on PATH")


@dataclass(frozen=True)
class Target:
    address: str
    """host:port of a process's admin HTTP server (serves /metrics)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Added to every series scraped from it: rljob, role, pool, replica."""


class LocalPrometheus:
    def __init__(self, directory: Path, scrape_interval_s: float = 1.0, rules: Path | None = RULES_FILE,
                 binary: str | None = None, port: int = 0):
        found = binary or shutil.which("prometheus")
        if not found:
            raise FileNotFoundError(MISSING)
        self.binary = found
        self.directory = Path(directory).resolve()
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.scrape_interval_s = scrape_interval_s
        self.rules = Path(rules).resolve() if rules else None
        self.targets_file = self.directory / "targets.json"
        self.log_path = self.directory / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def _config(self) -> dict:
        interval = f"{max(1, round(self.scrape_interval_s * 1000))}ms"
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "rule_files": [str(self.rules)] if self.rules else [],
            "scrape_configs": [{
                "job_name": "streamrl",
                "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "5s"}],
            }],
        }

    def set_targets(self, targets: list[Target]) -> None:
        """Replace the scraped processes (atomically; Prometheus notices the file change)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": [t.address], "labels": t.labels} for t in targets], indent=1))
        os.replace(tmp, self.targets_file)

    def start(self, timeout_s: float = 30.0) -> str:
        """Start and wait until ready; returns its URL."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.targets_file.exists():
            self.set_targets([])
        config = self.directory / "prometheus.yml"
        config.write_text(yaml.safe_dump(self._config(), sort_keys=False))
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=30d"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"prometheus was not ready within {timeout_s:.0f}s; see {self.log_path}")

    def target_health(self) -> dict[str, tuple[str, str]]:
        """{address: (health, last scrape error)} of every target Prometheus discovered;
        health is "up", "down" or "unknown" (not scraped yet). Raises PrometheusError."""
        try:
            reply = httpx.get(f"{self.url}/api/v1/targets", params={"state": "active"}, timeout=5.0)
            targets = reply.json()["data"]["activeTargets"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
            raise PrometheusError(f"Prometheus at {self.url} does not list its targets: {err!r}") from None
        return {t["labels"]["instance"]: (t["health"], t.get("lastError", "")) for t in targets}

    def last_error(self) -> str:
        """Prometheus's own last error or warning log line ("" when it logged none)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return next((line for line in reversed(lines) if re.search(r"level=(error|warn)", line, re.I)), "")

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query's result vector (raises PrometheusError on a PromQL error)."""
        api = PrometheusAPI(self.url)
        try:
            return api.query(expr, at)
        finally:
            api.close()

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (Prometheus flushes its data on the way out), then SIGKILL if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
