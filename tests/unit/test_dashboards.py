"""The Grafana dashboards: regenerated identically from code, every query valid PromQL over
metrics that exist, and the panels the overview, generation and weights views promise."""

import importlib.util
import json
import re
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
            "Scaling decisions (replicas added or removed per 5 minutes)"} <= titles["overview.json"]
    assert {"Batch occupancy", "Tokens/s per replica", "Queue depth", "Output length quantiles",
            "Ranker recall of the true top-x% longest", "Predicted vs actual mean length"} <= titles["generation.json"]
    assert {"Weight sync seconds (p90)", "Weight bytes/s", "Sample staleness (versions)"} <= titles["weights.json"]


def test_lint_catches_a_broken_query():
    with pytest.raises(ValueError):
        promql_parser.parse('sum(rate(streamrl_generated_tokens_total{rljob=~".*"}[1m])')
