"""The Grafana dashboards: regenerated identically from code, every query valid PromQL over
metrics that exist, and the panels the overview, generation and weights views promise."""

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import promql_parser
import pytest
import yaml

from streamrl import metrics
from streamrl.prometheus import RULES_FILE

ROOT = Path(__file__).resolve().parents[2]
CHART_FILES = ROOT / "helm" / "streamrl" / "files"
DASHBOARD_DIR = CHART_FILES / "dashboards"
# Grafana's own variables, as a lint (and the e2e test) substitutes them.
SUBSTITUTIONS = {"$__rate_interval": "1m", "$__interval": "15s", "$rljob": ".*"}


def _generator():
    spec = importlib.util.spec_from_file_location("gen_observability", ROOT / "scripts" / "gen_observability.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboard_queries() -> dict[str, list[tuple[str, str]]]:
    """{dashboard file: [(panel title, PromQL with Grafana variables substituted)]}."""
    out = {}
    for path in sorted(DASHBOARD_DIR.glob("*.json")):
        queries = []
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for var, value in SUBSTITUTIONS.items():
                    expr = expr.replace(var, value)
                queries.append((panel["title"], expr))
        out[path.name] = queries
    return out


def test_committed_dashboards_equal_a_fresh_generation():
    fresh = _generator().render()
    assert sorted(fresh) == sorted(p.name for p in DASHBOARD_DIR.glob("*.json"))
    for name, text in fresh.items():
        assert (DASHBOARD_DIR / name).read_text() == text, f"{name} is stale: run scripts/gen_observability.py"


def test_chart_copy_of_the_rules_is_current():
    committed = CHART_FILES / "prometheus-rules.yaml"
    assert committed.read_text() == _generator().rules_copy(), "stale: run scripts/gen_observability.py"
    assert yaml.safe_load(committed.read_text()) == yaml.safe_load(RULES_FILE.read_text())


def test_every_query_parses_and_names_known_metrics():
    records = {r["record"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]
               if "record" in r}
    known = {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str)} | records
    queries = dashboard_queries()
    assert sum(map(len, queries.values())) >= 30
    for name, items in queries.items():
        for title, expr in items:
            assert "$" not in expr, f"{name} / {title}: unsubstituted variable in {expr}"
            try:
                promql_parser.parse(expr)
            except ValueError as err:
                pytest.fail(f"{name} / {title}: {err}: {expr}")
            for metric in re.findall(r"\b(streamrl[:_][a-z0-9_:]+)", expr):
                base = re.sub(r"_(total|bucket|sum|count)$", "", metric)
                assert base in known, f"{name} / {title}: unknown metric {metric}"


def test_the_promised_panels_are_there():
    titles = {path.name: {p["title"] for p in json.loads(path.read_text())["panels"]}
              for path in DASHBOARD_DIR.glob("*.json")}
    assert {"Phase", "Samples/s and tokens/s", "Reward (mean of the last iteration)", "Bubble ratios",
            "Generation vs training time per iteration", "Generator replicas per pool: desired vs connected",
            "Scaling decisions (replicas added or removed per 5 minutes)", "Trainer ranks: busy vs waiting",
            "Trainer ranks: forward/backward and collective seconds per second"} <= titles["overview.json"]
    assert {"Batch occupancy", "Tokens/s per replica", "Queue depth", "Output length quantiles",
            "Ranker recall of the true top-x% longest", "Predicted vs actual mean length"} <= titles["generation.json"]
    assert {"Weight sync seconds (p90)", "Weight bytes/s", "Sample staleness (versions)"} <= titles["weights.json"]


def test_lint_catches_a_broken_query():
    with pytest.raises(ValueError):
        promql_parser.parse('sum(rate(streamrl_generated_tokens_total{rljob=~".*"}[1m])')


def test_trainer_ranks_panel_gives_each_rank_its_own_busy_and_waiting(tmp_path):
    """The busy/idle counters carry no rank; the panel joins them to each process's
    streamrl_trainer_rank_info. Series as a local run's Prometheus stores them: rank 0's
    target has no rank label, rank 1's has one (its own exported as exported_rank)."""
    [busy, idle] = [expr for title, expr in dashboard_queries()["overview.json"]
                    if title == "Trainer ranks: busy vs waiting"]
    r0, r1, gen = 'rljob="a", instance="t0", role="trainer"', 'rljob="a", instance="t1", role="trainer", rank="1"', \
        'rljob="a", instance="g0", role="generator"'
    series = {  # seconds per 15 s step
        f'streamrl_trainer_rank_info{{{r0}, rank="0", world_size="2"}}': "1x40",
        f'streamrl_trainer_rank_info{{{r1}, exported_rank="1", world_size="2"}}': "1x40",
        f'streamrl_stage_busy_seconds_total{{{r0}, stage="trainer"}}': "0+12x40",
        f'streamrl_stage_idle_seconds_total{{{r0}, stage="trainer", reason="waiting_samples"}}': "0+3x40",
        f'streamrl_stage_busy_seconds_total{{{r1}, stage="trainer"}}': "0+9x40",
        f'streamrl_stage_idle_seconds_total{{{r1}, stage="trainer", reason="waiting_leader"}}': "0+6x40",
        f'streamrl_stage_busy_seconds_total{{{gen}, stage="generator"}}': "0+15x40",
    }
    test = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "promql_expr_test": [
            {"expr": busy, "eval_time": "5m", "exp_samples": [
                {"labels": '{rljob="a", rank="0"}', "value": 0.8}, {"labels": '{rljob="a", rank="1"}', "value": 0.6}]},
            {"expr": idle, "eval_time": "5m", "exp_samples": [
                {"labels": '{rljob="a", rank="0", reason="waiting_samples"}', "value": 0.2},
                {"labels": '{rljob="a", rank="1", reason="waiting_leader"}', "value": 0.4}]},
        ]}]}
    path = tmp_path / "ranks_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    run = subprocess.run([shutil.which("promtool") or "promtool", "test", "rules", str(path)], capture_output=True,
                         text=True)
    assert run.returncode == 0 and "SUCCESS" in run.stdout + run.stderr, run.stdout + run.stderr
