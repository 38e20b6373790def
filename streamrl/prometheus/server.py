"""A Prometheus server for one local run: loopback only, StreamRL's rules loaded, targets
from a file the runner rewrites as processes come and go (file-based service discovery,
so replicas added or removed later are picked up without a restart)."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from streamrl.prometheus import RULES_FILE
from streamrl.prometheus.api import PrometheusAPI

MISSING = ("no `prometheus` binary on PATH: install Debian's prometheus package (apt-get install prometheus) "
           "or put a release from prometheus.io on PATH")


@dataclass(frozen=True)
class Target:
    address: str
    """host:port of a process's admin HTTP server (serves /metrics)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Added to every series scraped from it: rljob, role, pool, replica."""


_handed_out: set[int] = set()


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The bottom of the kernel's ephemeral port range (Linux's default when unreadable)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port free on loopback now, for a process started next; never the same one
    twice in this process. It comes from below the kernel's ephemeral range: a port from
    that range could be handed to another socket binding port 0 (the trainer's gRPC
    server, an outgoing connection) before the process that was promised it binds it."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(64 if low > 11000 else 0):
        port = rng.randrange(10000, low)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPrometheus:
    def __init__(self, directory: Path, scrape_interval_s: float = 1.0, rules: Path | None = RULES_FILE,
                 binary: str | None = None, port: int = 0):
        self.binary = binary or shutil.which("prometheus")
        if not self.binary:
            raise FileNotFoundError(MISSING)
        self.directory = Path(directory)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.scrape_interval_s = scrape_interval_s
        self.rules = rules
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
