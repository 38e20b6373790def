"""The run's own Prometheus (`--prometheus`, or Internal autoscaling reading its inputs):
started before the services with every planned process as a target, its targets kept
current as processes come and go, and checked once the services start: every process that
answers on its admin port must be reported up within scrape_timeout_s(), else the run fails
naming the targets and Prometheus's own last error. Knows nothing of what it scrapes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import httpx

from streamrl.local import RunFailed
from streamrl.local.children import STARTUP_TIMEOUT_S, Child
from streamrl.local.plan import RunPlan
from streamrl.local.prometheus import LocalPrometheus, Target
from streamrl.prometheus.api import PrometheusError

SCRAPE_TIMEOUT_ENV = "STREAMRL_SCRAPE_TIMEOUT_S"


def scrape_timeout_s() -> float:
    """How long Prometheus may take to report a process up once it answers on its admin port:
    60 s, or STREAMRL_SCRAPE_TIMEOUT_S. It re-reads the targets file when it changes (at the
    latest every 5 s) and scrapes every second, so a few seconds is normal; a minute is
    generous on two busy cores."""
    raw = os.environ.get(SCRAPE_TIMEOUT_ENV, "60")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{SCRAPE_TIMEOUT_ENV}={raw!r}: must be a number of seconds above 0")
    return value
POLL_S = 0.5


class RunMonitor:
    """The run's LocalPrometheus, its targets (planned, then the processes running) and the scrape check."""

    def __init__(self, plan: RunPlan):
        """Fails (ValueError naming what asked for it) without a Prometheus binary, or with a
        STREAMRL_SCRAPE_TIMEOUT_S that is no number of seconds, before anything starts."""
        self.scrape_timeout_s = scrape_timeout_s()
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
        try:
            return self.server.start()
        except RuntimeError as err:  # it exited, or never got ready
            raise RunFailed(f"{err}; its last error: {self.server.last_error() or 'none logged'}") from None

    def add(self, name: str, address: str, labels: dict[str, str]) -> None:
        """Scrape a server of this process too (the autoscaler's)."""
        self.extra[name] = Target(address, labels)

    def update(self, children: list[Child]) -> None:
        """Scrape the children still running (and this process's servers), no others."""
        self._set([self._target(c) for c in children if c.running() and c.admin_port is not None]
                  + list(self.extra.values()))

    def wait_until_scraped(self, children: Callable[[], list[Child]], say: Callable[[str], None],
                           warn: Callable[[str], None], timeout_s: float | None = None,
                           startup_timeout_s: float = STARTUP_TIMEOUT_S) -> float | None:
        """Wait until Prometheus has reported every running child (and this process's servers)
        up; returns the seconds it took. RunFailed when one answers on its admin port and is
        not up `timeout_s` later, or has not answered within `startup_timeout_s`. A child that
        exits unscraped is the supervisor's business, unless it is the trainer: then the run is
        over (shorter than the bound) and it `warn`s what was never scraped; None."""
        timeout_s = self.scrape_timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        waiting_for = [c.name for c in children() if c.running()] + list(self.extra)
        say(f"prometheus: waiting until it scrapes {', '.join(waiting_for)} (up to {timeout_s:.0f} s after each "
            "answers on its admin port)")
        names = {self._target(c).address: c.name for c in children() if c.admin_port is not None}
        """Address -> process name, of every target waited for."""
        answered: dict[str, float] = {}
        """Address -> when it first answered us on /metrics."""
        seen_up: set[str] = set()
        with httpx.Client(timeout=2.0) as http:
            while True:
                running = [c for c in children() if c.running()]
                self.update(running)
                expected = {self._target(c).address: c.name for c in running if c.admin_port is not None}
                expected.update({t.address: name for name, t in self.extra.items()})
                names.update(expected)
                assert self.server.proc is not None  # started before it waits
                if self.server.proc.poll() is not None:
                    raise RunFailed(f"prometheus exited with {self.server.proc.returncode}: "
                                    f"{self.server.last_error() or 'no error logged'}; see {self.server.log_path}")
                try:
                    health, unlisted = self.server.target_health(), ""
                except PrometheusError as err:
                    health, unlisted = {}, str(err)
                seen_up.update(a for a, (status, _) in health.items() if status == "up")
                now = time.monotonic()
                if not any(c.role == "trainer" for c in running):
                    never = [a for a in names if a not in seen_up]
                    if never:
                        warn(f"warning: the run ended before Prometheus at {self.url} scraped every process: "
                             + self._why(never, names, answered, health, unlisted, now))
                        return None
                pending = [a for a in expected if a not in seen_up]
                if not pending:
                    say(f"prometheus: scraping all {len(expected)} processes, {now - t0:.1f} s after they started")
                    return now - t0
                for address in pending:
                    if address not in answered and _answers(http, address):
                        answered[address] = now
                late = [a for a in pending if a in answered and now - answered[a] > timeout_s]
                silent = [a for a in pending if a not in answered and now - t0 > startup_timeout_s]
                if late or silent:
                    raise RunFailed(f"Prometheus at {self.url} has not scraped every process within {timeout_s:.0f} s "
                                    f"of it answering on its admin port ({startup_timeout_s:.0f} s for it to answer): "
                                    + self._why(pending, names, answered, health, unlisted, now))
                time.sleep(POLL_S)

    def _why(self, pending: list[str], names: dict[str, str], answered: dict[str, float],
             health: dict[str, tuple[str, str]], unlisted: str, now: float) -> str:
        """Every target not seen up: what Prometheus says of it, how long it has answered us,
        and Prometheus's own last error."""
        def state(address: str) -> str:
            if address not in health:
                seen = "not among its targets"
            else:
                status, error = health[address]
                seen = f"{status}{f': {error}' if error else ''}"
            return f"{names[address]} ({address}: {seen}; " + (
                f"answering on its admin port for {now - answered[address]:.0f} s)" if address in answered
                else "not answering on its admin port)")

        last = unlisted or self.server.last_error()
        return (", ".join(state(a) for a in pending) + (f"; Prometheus's last error: {last}" if last else "")
                + f"; its config and log are in {self.server.directory}")

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
