"""The Helm chart, rendered by the real helm binary: lint, every object valid for
Kubernetes (strict), values checked by the schema, CRDs kept, least-privilege RBAC, and
monitoring/dashboards behind values carrying exactly what the repository defines."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from streamrl.operator.crd import rlcluster_crd, rljob_crd
from streamrl.prometheus import RULES_FILE
from tests.k8stools import tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "streamrl"
ALL_ON = ["monitoring.podMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
          "grafana.dashboards.enabled=true"]


def render(*sets: str, namespace: str = "streamrl-system") -> list[dict]:
    args = [tool("helm"), "template", "rel", str(CHART), "--namespace", namespace, "--include-crds",
            "--kube-version", "1.33.0"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for o in objects:
        out.setdefault(o["kind"], []).append(o)
    return out


def test_lint_strict():
    out = subprocess.run([tool("helm"), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_rendered_object_is_valid_kubernetes():
    objects = render(*ALL_ON)
    checked = 0
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, "1.33", strict=True)
            checked += 1
        except kubernetes_validate.SchemaNotFoundError:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1", obj["kind"]  # Prometheus Operator kinds
    assert checked >= 10


def test_crds_come_from_the_generated_files_and_are_kept():
    crds = {c["metadata"]["name"]: c for c in by_kind(render())["CustomResourceDefinition"]}
    assert sorted(crds) == ["rlclusters.streamrl.io", "rljobs.streamrl.io"]
    assert crds["rljobs.streamrl.io"]["spec"] == rljob_crd()["spec"]
    assert crds["rlclusters.streamrl.io"]["spec"] == rlcluster_crd()["spec"]
    assert all(c["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"} for c in crds.values())
    crds = by_kind(render("crds.keep=false"))["CustomResourceDefinition"]
    assert all("annotations" not in c["metadata"] for c in crds)
    assert "CustomResourceDefinition" not in by_kind(render("crds.install=false"))


@pytest.mark.parametrize("bad, message", [
    ("bogus=1", "additional properties 'bogus' not allowed"),
    ("operator.replicas=2", "additional properties 'replicas' not allowed"),
    ("image.pullPolicy=Sometimes", "pullPolicy"),
    ("monitoring.podMonitor.interval=soon", "interval"),
    ("operator.prometheusUrl=prometheus:9090", "prometheusUrl"),
    ("operator.metricsPort=0", "metricsPort"),
])
def test_values_schema_rejects_bad_values(bad, message):
    out = subprocess.run([tool("helm"), "template", "rel", str(CHART), "--set", bad], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_operator_runs_one_replica_recreated_non_root():
    [deployment] = by_kind(render())["Deployment"]
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    assert container["image"] == "ghcr.io/streamrl/streamrl:0.1.0"
    assert container["args"][:2] == ["--log-level=INFO", "operator"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STREAMRL_JOB_IMAGE"] == "ghcr.io/streamrl/streamrl:0.1.0"
    assert env["STREAMRL_PROMETHEUS_URL"] == "" and env["STREAMRL_OPERATOR_METRICS_PORT"] == "8081"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"health": 8080, "metrics": 8081}


def test_autoscaler_settings_reach_the_operator():
    [deployment] = by_kind(render("operator.prometheusUrl=http://prometheus.monitoring:9090",
                                  "operator.metricsPort=9100"))["Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STREAMRL_PROMETHEUS_URL"] == "http://prometheus.monitoring:9090"
    assert env["STREAMRL_OPERATOR_METRICS_PORT"] == "9100"
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == 9100


def test_rbac_is_least_privilege():
    objects = by_kind(render())
    rules = [r for role in objects["ClusterRole"] + objects["Role"] for r in role["rules"]]
    assert all("*" not in r["verbs"] and "*" not in r["resources"] for r in rules)
    secrets = [r for r in rules if "secrets" in r["resources"]]
    assert secrets == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}]
    [secret_role] = [r for r in objects["Role"] if "secrets" in r["rules"][0]["resources"]]
    assert secret_role["metadata"]["namespace"] == "streamrl-system"  # kubeconfigs: the operator's namespace only
    assert not any("delete" in r["verbs"] for r in rules if "rljobs" in r["resources"])
    # Checkpoint claims: created, never deleted by the operator (a claim not retained goes with its job).
    [claims] = [r for r in rules if "persistentvolumeclaims" in r["resources"]]
    assert "create" in claims["verbs"] and "delete" not in claims["verbs"]
    # Watching chosen namespaces: namespaced Roles there, no cluster-wide rights over jobs.
    scoped = by_kind(render("operator.watchNamespaces={team-a,team-b}"))
    job_roles = [r for r in scoped["Role"] if any("deployments" in x["resources"] for x in r["rules"])]
    assert sorted(r["metadata"]["namespace"] for r in job_roles) == ["team-a", "team-b"]
    assert not any("deployments" in x["resources"] for r in scoped["ClusterRole"] for x in r["rules"])
    [deployment] = scoped["Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][2:] == \
        ["--namespace=team-a", "--namespace=team-b"]


def test_monitoring_and_dashboards_behind_values():
    assert {"PodMonitor", "PrometheusRule"}.isdisjoint(by_kind(render()))
    objects = by_kind(render(*ALL_ON))
    [rule] = objects["PrometheusRule"]
    assert rule["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]
    monitors = {m["metadata"]["name"]: m for m in objects["PodMonitor"]}
    assert sorted(monitors) == ["rel-streamrl-jobs", "rel-streamrl-operator"]
    [endpoint] = monitors["rel-streamrl-jobs"]["spec"]["podMetricsEndpoints"]
    relabel = {r["targetLabel"] for r in endpoint["relabelings"] if "targetLabel" in r}
    assert relabel == {"rljob", "role", "pool", "replica"}
    # Scraped: every admin port, each rank's of a sharded trainer too (admin-r1...), and no other.
    [keep] = [r for r in endpoint["relabelings"] if r.get("action") == "keep"]
    assert keep["sourceLabels"] == ["__meta_kubernetes_pod_container_port_name"]
    ports = ["admin", "admin-r1", "admin-r7", "grpc", "relay", "rendezvous", "metrics"]
    assert [p for p in ports if re.fullmatch(keep["regex"], p)] == ["admin", "admin-r1", "admin-r7"]
    # The operator's own /metrics (the autoscaler's series): its pod, its metrics port.
    operator = monitors["rel-streamrl-operator"]["spec"]
    [deployment] = objects["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert operator["selector"]["matchLabels"].items() <= pod_labels.items()
    assert operator["namespaceSelector"] == {"matchNames": ["streamrl-system"]}
    assert operator["podMetricsEndpoints"][0]["port"] == "metrics"
    dashboards = [c for c in objects["ConfigMap"] if c["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(dashboards) == 3
    for cm in dashboards:
        [(name, text)] = cm["data"].items()
        assert json.loads(text) == json.loads((CHART / "files" / "dashboards" / name).read_text())
