"""The operator's settings are loaded once, at startup, from flags and the environment; a bad
value stops the start with the flag or variable named; importing the operator reads no
STREAMRL_ variable (the handlers take their intervals from the settings they are given)."""

import os
import subprocess
import sys
from pathlib import Path

import kopf
import pytest

from streamrl.cli import main
from streamrl.operator.handlers import register
from streamrl.operator.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[3]


def test_defaults_then_environment_then_flags():
    assert load_settings({}) == Settings()
    env = {"STREAMRL_JOB_IMAGE": "registry.local/streamrl:dev", "STREAMRL_JOB_IMAGE_PULL_POLICY": "Always",
           "STREAMRL_TRAINER_BACKOFF_LIMIT": "0", "STREAMRL_OPERATOR_NAMESPACE": "streamrl-system",
           "STREAMRL_OPERATOR_STATUS_INTERVAL_S": "2.5", "STREAMRL_PROMETHEUS_URL": "http://prom:9090",
           "STREAMRL_OPERATOR_METRICS_PORT": "9100", "STREAMRL_CLUSTER_ID": "prod-eu",
           "STREAMRL_LEADER_ELECTION": "false"}
    loaded = load_settings(env)
    assert loaded == Settings(image="registry.local/streamrl:dev", image_pull_policy="Always",
                              trainer_backoff_limit=0, namespace="streamrl-system", status_interval_s=2.5,
                              prometheus_url="http://prom:9090", metrics_port=9100, cluster_id="prod-eu",
                              leader_election=False)
    flagged = load_settings(env, namespaces=["rl"], health_port=9000, metrics_port=0, prometheus_url="")
    assert (flagged.watch_namespaces, flagged.health_port, flagged.metrics_port, flagged.prometheus_url) == \
        (("rl",), 9000, 0, "")
    # The chart passes an empty URL for "none".
    assert load_settings({"STREAMRL_PROMETHEUS_URL": ""}).prometheus_url == ""


@pytest.mark.parametrize("pod_ip, host", [("fd00:10:244::5", "::"), ("10.244.0.5", "0.0.0.0"), ("", "0.0.0.0")])
def test_healthz_and_metrics_listen_on_the_pods_address_family(pod_ip, host):
    """N19: an IPv6 pod's kubelet probes its IPv6 address (kopf's server, on asyncio, is
    IPv6-only on `::`); elsewhere every IPv4 address, as before."""
    assert load_settings({"POD_IP": pod_ip}).listen_host == host


@pytest.mark.parametrize("env, flags, message", [
    ({"STREAMRL_OPERATOR_STATUS_INTERVAL_S": "ten"}, {},
     "STREAMRL_OPERATOR_STATUS_INTERVAL_S must be a number of seconds > 0, got 'ten'"),
    ({"STREAMRL_OPERATOR_STATUS_INTERVAL_S": "0"}, {},
     "STREAMRL_OPERATOR_STATUS_INTERVAL_S must be a number of seconds > 0, got '0'"),
    ({"STREAMRL_TRAINER_BACKOFF_LIMIT": "-1"}, {}, "STREAMRL_TRAINER_BACKOFF_LIMIT must be an integer >= 0, got '-1'"),
    ({"STREAMRL_CLUSTER_ID": "prod/eu"}, {},
     "STREAMRL_CLUSTER_ID must be a label value (letters, digits, '-', '_', '.'; at most 63), got 'prod/eu'"),
    ({"STREAMRL_JOB_IMAGE_PULL_POLICY": "Sometimes"}, {},
     "STREAMRL_JOB_IMAGE_PULL_POLICY must be one of Always, IfNotPresent, Never, got 'Sometimes'"),
    ({"STREAMRL_OPERATOR_METRICS_PORT": "http"}, {},
     "STREAMRL_OPERATOR_METRICS_PORT must be a port number in 0..65535, got 'http'"),
    ({}, {"metrics_port": 70000},
     "--metrics-port (STREAMRL_OPERATOR_METRICS_PORT) must be a port number in 0..65535, got '70000'"),
    ({"STREAMRL_PROMETHEUS_URL": "prometheus:9090"}, {},
     "--prometheus-url (STREAMRL_PROMETHEUS_URL) must be an http:// or https:// URL, got 'prometheus:9090'"),
])
def test_a_bad_setting_is_refused_with_its_name(env, flags, message):
    with pytest.raises(ValueError) as err:
        load_settings(env, **flags)
    assert str(err.value) == message


def test_a_bad_status_interval_fails_the_operators_start_with_the_variable_named(monkeypatch, capsys):
    monkeypatch.setenv("STREAMRL_OPERATOR_STATUS_INTERVAL_S", "soon")
    assert main(["operator"]) == 2
    assert "STREAMRL_OPERATOR_STATUS_INTERVAL_S must be a number of seconds > 0, got 'soon'" in \
        capsys.readouterr().err


def test_operator_refuses_a_prometheus_url_that_is_not_http(capsys):
    assert main(["operator", "--prometheus-url", "prometheus:9090"]) == 2
    assert "--prometheus-url (STREAMRL_PROMETHEUS_URL) must be an http:// or https:// URL" in capsys.readouterr().err


def test_the_status_timer_runs_at_the_settings_interval():
    registry = register(kopf.OperatorRegistry(), Settings(status_interval_s=3.0), cluster_probe_s=45.0)
    timers = [h for h in registry._spawning.get_all_handlers() if type(h).__name__ == "TimerHandler"]
    # RLJobs: the whole reconcile again; RLClusters: reachability and permissions probed again
    assert sorted((h.id, h.interval, h.initial_delay) for h in timers) == [("probe", 45.0, 45.0),
                                                                          ("refresh", 3.0, 1.5)]


SPY = """
import os, sys
read = set()
class Spy(dict):
    def __getitem__(self, key):
        read.add(key)
        return super().__getitem__(key)
    def get(self, key, default=None):
        read.add(key)
        return super().get(key, default)
    def __contains__(self, key):
        read.add(key)
        return super().__contains__(key)
os.environ = Spy(os.environ)
import streamrl.operator.main, streamrl.operator.handlers, streamrl.operator.crd  # noqa
print(sorted(k for k in read if k.startswith("STREAMRL_")))
"""


def test_importing_the_operator_reads_no_streamrl_variable():
    env = {**os.environ, "STREAMRL_OPERATOR_STATUS_INTERVAL_S": "not read at import"}
    out = subprocess.run([sys.executable, "-c", SPY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
