"""The run's Prometheus check (RunMonitor.wait_until_scraped) against a real Prometheus and
real processes serving /metrics (Python's http.server over a metrics file), with short
bounds: every process seen up, a Prometheus that cannot find its targets failing loudly,
and a run that ends before it was scraped said so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.local import RunFailed
from streamrl.local.children import Child
from streamrl.local.monitor import SCRAPE_TIMEOUT_ENV, RunMonitor, scrape_timeout_s
from streamrl.local.plan import plan_run
from streamrl.local.prometheus import MISSING
from streamrl.spec import parse_job
from tests.blind_prometheus import blind_prometheus_dir

pytestmark = pytest.mark.skipif(not shutil.which("prometheus"), reason=MISSING)


@pytest.fixture
def run_parts(tmp_path, monkeypatch):
    """(plan, children serving /metrics on their planned admin ports, started monitors)."""
    monkeypatch.chdir(tmp_path)
    job = parse_job({"metadata": {"name": "watched"}, "spec": {"model": {"source": "builtin-tiny"}}})
    plan = plan_run(job, Path("runs/w"), False, None, lambda msg: None)
    site = tmp_path / "site"
    site.mkdir()
    (site / "metrics").write_text("streamrl_test_up 1\n")
    children, monitors = [], []
    for name, labels in plan.processes.items():  # trainer, generator-default-0
        port = plan.admin_ports[name]
        proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                 "--directory", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        children.append(Child(name, proc, tmp_path / f"{name}.log", admin_port=port, labels=labels))
    yield plan, children, monitors
    for m in monitors:
        m.stop()
    for c in children:
        c.proc.kill()
        c.proc.wait()


def _broken_prometheus(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{blind_prometheus_dir(tmp_path)}:{os.environ['PATH']}")


def test_every_process_is_seen_up_and_the_wait_says_so(run_parts):
    plan, children, monitors = run_parts
    assert plan.out_dir.is_absolute()  # --out runs/w from the cwd, resolved once
    monitor = RunMonitor(plan)
    monitors.append(monitor)
    monitor.start()
    said, warned = [], []
    took = monitor.wait_until_scraped(lambda: children, said.append, warned.append, timeout_s=20)
    assert took is not None and took < 20 and warned == []
    assert said[-1].startswith("prometheus: scraping all 2 processes")
    up = {r["metric"]["role"]: r["value"][1] for r in monitor.server.query('up{rljob="watched"}')}
    assert up == {"trainer": "1", "generator": "1"}


def test_a_prometheus_that_cannot_find_its_targets_fails_with_its_own_error(run_parts, tmp_path, monkeypatch):
    plan, children, monitors = run_parts
    _broken_prometheus(tmp_path, monkeypatch)
    monitor = RunMonitor(plan)
    monitors.append(monitor)
    monitor.start()
    started = time.monotonic()
    with pytest.raises(RunFailed) as failed:
        monitor.wait_until_scraped(lambda: children, lambda msg: None, lambda msg: None, timeout_s=3)
    assert time.monotonic() - started < 30
    why = str(failed.value)
    assert why.startswith(f"Prometheus at {monitor.url} has not scraped every process within 3 s")
    assert f"trainer (127.0.0.1:{plan.admin_ports['trainer']}: not among its targets; answering" in why
    assert f"generator-default-0 (127.0.0.1:{plan.admin_ports['generator-default-0']}: not among its" in why
    assert 'msg="Error adding file watch"' in why and "no such file or directory" in why


def test_a_run_that_ends_before_it_is_scraped_is_warned_about(run_parts, tmp_path, monkeypatch):
    plan, children, monitors = run_parts
    _broken_prometheus(tmp_path, monkeypatch)
    monitor = RunMonitor(plan)
    monitors.append(monitor)
    monitor.start()
    for c in children:  # the run is over (a run shorter than the bound)
        c.proc.kill()
        c.proc.wait()
    warned = []
    assert monitor.wait_until_scraped(lambda: children, lambda msg: None, warned.append, timeout_s=60) is None
    [warning] = warned
    assert warning.startswith(f"warning: the run ended before Prometheus at {monitor.url} scraped every process")
    assert "trainer (" in warning and "generator-default-0 (" in warning


def test_the_scrape_bound_is_a_minute_or_what_the_environment_says(monkeypatch):
    monkeypatch.delenv(SCRAPE_TIMEOUT_ENV, raising=False)
    assert scrape_timeout_s() == 60.0
    monkeypatch.setenv(SCRAPE_TIMEOUT_ENV, "7.5")
    assert scrape_timeout_s() == 7.5
    for bad in ("soon", "0", "-3", "nan"):
        monkeypatch.setenv(SCRAPE_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"STREAMRL_SCRAPE_TIMEOUT_S='{bad}': must be a number of seconds"):
            scrape_timeout_s()
