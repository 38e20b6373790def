"""The recording rules and alerts, checked and unit-tested by Prometheus's own promtool."""

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from streamrl.prometheus import RULES_FILE

ROOT = Path(__file__).resolve().parents[2]
RULES_TEST = ROOT / "tests" / "prometheus" / "rules_test.yaml"


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: install Debian's prometheus package (apt-get install prometheus); .ci/run does"
    return path


def test_rules_pass_promtool_check_and_unit_tests():
    check = subprocess.run([_promtool(), "check", "rules", str(RULES_FILE)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run([_promtool(), "test", "rules", str(RULES_TEST)], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout + run.stderr


def test_every_rule_and_alert_has_a_test_case():
    rules = [r for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]]
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    tested_exprs = {c["expr"] for t in tests for c in t.get("promql_expr_test", [])}
    fired = {c["alertname"] for t in tests for c in t.get("alert_rule_test", []) if c["exp_alerts"]}
    quiet = {c["alertname"] for t in tests for c in t.get("alert_rule_test", []) if not c["exp_alerts"]}
    records = {r["record"] for r in rules if "record" in r}
    alerts = {r["alert"] for r in rules if "alert" in r}
    assert len(records) >= 6 and len(alerts) >= 4
    assert records - tested_exprs == set(), "recording rules without a promql_expr_test"
    assert alerts - fired == set(), "alerts never seen firing in a test"
    assert alerts - quiet == set(), "alerts never checked to stay quiet"
    # Each rule names only metrics that streamrl/metrics.py defines (or other rules).
    from streamrl import metrics

    known = {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str)} | records
    for rule in rules:
        for name in re.findall(r"\b(streamrl[:_][a-z0-9_:]+)", rule["expr"]):
            assert name.removesuffix("_total") in known, f"{rule.get('record') or rule['alert']}: unknown {name}"
