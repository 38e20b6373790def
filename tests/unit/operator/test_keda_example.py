"""The KEDA example: its target is an RLJob (the CRD's group and kind, an example job's
name), its query is PromQL over metrics and rules that exist, and promtool evaluates it
to the replica counts its comment promises."""

import re
import shutil
import subprocess
from pathlib import Path

import promql_parser
import pytest
import yaml

from streamrl import metrics
from streamrl.prometheus import RULES_FILE
from streamrl.spec import GROUP, KIND, VERSION

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "deploy" / "examples" / "keda-scaledobject.yaml"


def scaled_object() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def query() -> str:
    [trigger] = scaled_object()["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    return trigger["metadata"]["query"]


def test_scale_target_is_an_example_rljob_that_leaves_scale_to_keda():
    obj = scaled_object()
    assert (obj["apiVersion"], obj["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    target = obj["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == (f"{GROUP}/{VERSION}", KIND)
    jobs = {yaml.safe_load(p.read_text())["metadata"]["name"]
            for p in (ROOT / "deploy" / "examples").glob("rljob-*.yaml")}
    assert target["name"] in jobs
    assert 1 <= obj["spec"]["minReplicaCount"] <= obj["spec"]["maxReplicaCount"]
    assert "mode: External" in EXAMPLE.read_text()  # the header tells the RLJob to leave /scale to KEDA
    [trigger] = obj["spec"]["triggers"]
    assert float(trigger["metadata"]["threshold"]) > 0
    assert trigger["metadata"]["serverAddress"].startswith("http")


def test_query_parses_and_names_only_metrics_and_rules_that_exist():
    expr = query()
    promql_parser.parse(expr)
    records = {r["record"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]
               if "record" in r}
    known = {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str)} | records
    names = re.findall(r"\b(streamrl[:_][a-z0-9_:]+)", expr)
    assert names
    for name in names:
        assert re.sub(r"_(total|bucket|sum|count)$", "", name) in known, f"unknown metric {name}"
    target = scaled_object()["spec"]["scaleTargetRef"]["name"]
    assert set(re.findall(r'rljob="([^"]*)"', expr)) == {target}


@pytest.mark.parametrize("generating, training, replicas", [
    (0.75, 0.25, 6.0),  # generation-bound: the trainer waits for samples -> three times as many
    (0.25, 1.0, 0.5),   # training-bound: generators idle three quarters of the time -> fewer
    (0.8, 0.8, 2.0),    # balanced -> as many as now
])
def test_query_asks_for_replicas_in_proportion_to_the_stage_imbalance(tmp_path, generating, training, replicas):
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's prometheus package (apt-get install prometheus)"
    job = scaled_object()["spec"]["scaleTargetRef"]["name"]
    busy = "streamrl_stage_busy_seconds_total"
    series = [  # two generators (one per pool) and the trainer, busy the given fraction of every 15 s scrape
        {"series": f'{busy}{{rljob="{job}", stage="generator", pool="l4", replica="l4-0"}}',
         "values": f"0+{15 * generating}x40"},
        {"series": f'{busy}{{rljob="{job}", stage="generator", pool="a10g", replica="a10g-0"}}',
         "values": f"0+{15 * generating}x40"},
        {"series": f'{busy}{{rljob="{job}", stage="trainer"}}', "values": f"0+{15 * training}x40"},
        {"series": f'streamrl_pool_replicas{{rljob="{job}", role="trainer", pool="l4"}}', "values": "1x40"},
        {"series": f'streamrl_pool_replicas{{rljob="{job}", role="trainer", pool="a10g"}}', "values": "1x40"},
    ]
    case = {"rule_files": [str(RULES_FILE)], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": series,
        "promql_expr_test": [{"expr": query(), "eval_time": "5m",
                              "exp_samples": [{"labels": f'{{rljob="{job}"}}', "value": replicas}]}]}]}
    path = tmp_path / "keda_test.yaml"
    path.write_text(yaml.safe_dump(case, sort_keys=False))
    run = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
