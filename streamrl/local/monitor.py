"""The run's own Prometheus (`--prometheus`, or Internal autoscaling reading its inputs):
started before the services with every planned process as a target, its targets kept
current as processes come and go, and checked once the services start: every process that
answers on its admin port must be reported up within SCRAPE_TIMEOUT_S, else the run fails
naming the targets and Prometheus's own last error. Knows nothing of what it scrapes."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from streamrl.local import RunFailed
from streamrl.local.children import STARTUP_TIMEOUT_S, Child
from streamrl.local.plan import RunPlan
from streamrl.prometheus.api import PrometheusError
from streamrl.prometheus.server import LocalPrometheus, Target

SCRAPE_TIMEOUT_S = 60.0
"""How long Prometheus may take to report a process up once it answers on its admin port.
It re-reads the targets file when it changes (at the latest every 5 s) and scrapes every
second, so a few seconds is normal; a minute is generous on two busy cores."""
POLL_S = 0.5


class RunMonitor:
    def __init__(self, plan: RunPlan):
        """Fails (ValueError naming what asked for it) without a Prometheus binary, before anything starts."""
        try:
            self.server = LocalPrometheus(plan.out_dir / "prometheus")
        except FileNotFoundError as err:
            raise ValueError(f"{plan.prometheus_for}: {err}") from None
        self.rljob = plan.job.metadata.name
        self.planned = [Target(f"127.0.0.1:{plan.admin_ports[name]}", {"rljob": self.rljob, **labels})
                        for name, labels in plan.processes.items()]
        self.extra: dict[str, Target] = {}
        """Targets in this process (the autoscaler), by name."""
        self._targets: list[Target] = []

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> str:
        """Start Prometheus scraping every planned process (before any listens); returns its URL."""
        self._set(self.planned)
        return self.server.start()

    def add(self, name: str, address: str, labels: dict[str, str]) -> None:
        """Scrape a server of this process too (the autoscaler's)."""
        self.extra[name] = Target(address, labels)

    def update(self, children: list[Child]) -> None:
        """Scrape the children still running (and this process's servers), no others."""
        self._set([self._target(c) for c in children if c.running() and c.admin_port is not None]
                  + list(self.extra.values()))

    def wait_until_scraped(self, children: Callable[[], list[Child]], say: Callable[[str], None],
                           timeout_s: float = SCRAPE_TIMEOUT_S, startup_timeout_s: float = STARTUP_TIMEOUT_S) -> float:
        """Wait until Prometheus reports every running child (and this process's servers) up;
        returns the seconds it took. RunFailed when one answers on its admin port and is not
        up `timeout_s` later, or has not answered within `startup_timeout_s`. Returns early
        when the trainer exits (the caller reports that)."""
        t0 = time.monotonic()
        names = [c.name for c in children() if c.running()] + list(self.extra)
        say(f"prometheus: waiting until it scrapes {', '.join(names)} (up to {timeout_s:.0f} s after each "
            "answers on its admin port)")
        answered: dict[str, float] = {}
        """Address -> when it first answered us on /metrics."""
        with httpx.Client(timeout=2.0) as http:
            while True:
                running = [c for c in children() if c.running()]
                if not any(c.role == "trainer" for c in running):
                    return time.monotonic() - t0
                self.update(running)
                expected = {self._target(c).address: c.name for c in running if c.admin_port is not None}
                expected.update({t.address: name for name, t in self.extra.items()})
                if self.server.proc.poll() is not None:
                    raise RunFailed(f"prometheus exited with {self.server.proc.returncode}: "
                                    f"{self.server.last_error() or 'no error logged'}; see {self.server.log_path}")
                try:
                    health, unlisted = self.server.target_health(), ""
                except PrometheusError as err:
                    health, unlisted = {}, str(err)
                pending = [a for a in expected if health.get(a, ("",))[0] != "up"]
                now = time.monotonic()
                if not pending:
                    say(f"prometheus: scraping all {len(expected)} processes, {now - t0:.1f} s after they started")
                    return now - t0
                for address in pending:
                    if address not in answered and _answers(http, address):
                        answered[address] = now
                late = [a for a in pending if a in answered and now - answered[a] > timeout_s]
                silent = [a for a in pending if a not in answered and now - t0 > startup_timeout_s]
                if late or silent:
                    raise RunFailed(self._why(late, silent, expected, health, unlisted, timeout_s, startup_timeout_s))
                time.sleep(POLL_S)

    def _why(self, late: list[str], silent: list[str], names: dict[str, str], health: dict[str, tuple[str, str]],
             unlisted: str, timeout_s: float, startup_timeout_s: float) -> str:
        def state(address: str) -> str:
            if address not in health:
                return "not among its targets"
            status, error = health[address]
            return f"{status}{f': {error}' if error else ''}"

        parts = []
        if late:
            parts.append(f"Prometheus at {self.url} has not scraped "
                         + ", ".join(f"{names[a]} ({a}: {state(a)})" for a in late)
                         + f" within {timeout_s:.0f} s of it answering on its admin port")
        if silent:
            parts.append(", ".join(f"{names[a]} ({a})" for a in silent)
                         + f" did not answer on its admin port within {startup_timeout_s:.0f} s")
        last = unlisted or self.server.last_error()
        return "; ".join(parts) + (f"; Prometheus's last error: {last}" if last else "") \
            + f"; its config and log are in {self.server.directory}"

    def stop(self) -> None:
        self.server.stop()

    def _target(self, child: Child) -> Target:
        return Target(f"127.0.0.1:{child.admin_port}", {"rljob": self.rljob, **child.labels})

    def _set(self, targets: list[Target]) -> None:
        if targets != self._targets:
            self.server.set_targets(targets)
            self._targets = targets


def _answers(http: httpx.Client, address: str) -> bool:
    """Whether a process serves /metrics at `address` (what Prometheus scrapes)."""
    try:
        return http.get(f"http://{address}/metrics").status_code == 200
    except httpx.HTTPError:
        return False
