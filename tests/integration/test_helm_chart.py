"""The Helm chart, rendered by the real helm binary: lint, every object valid for
Kubernetes (strict), values checked by the schema, CRDs kept, least-privilege RBAC, users'
rights aggregated into edit and view, an operator pod that passes Pod Security "restricted",
the settings the operator reads from its environment, images pinned by digest, and
monitoring/dashboards behind values carrying exactly what the repository defines. (The
admission policy on RLJobs' pod templates: test_helm_admission_policy.py.)"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from streamrl.operator.crd import rlcluster_crd, rljob_crd
from streamrl.operator.settings import load_settings
from streamrl.prometheus import RULES_FILE
from tests.k8stools import CHART, MONITORING_API, by_kind, helm_template, render, tool

ROOT = Path(__file__).resolve().parents[2]
ALL_ON = ["monitoring.podMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
          "grafana.dashboards.enabled=true"]
DEFAULT_PROMETHEUS_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                           "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
# Pod Security Standards, "restricted" (https://kubernetes.io/docs/concepts/security/pod-security-standards/)
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"
DIGEST = "sha256:" + "0123456789abcdef" * 4


def operator_pod(*sets: str) -> dict:
    [deployment] = by_kind(render(*sets))["Deployment"]
    return deployment["spec"]["template"]["spec"]


def operator_env(*sets: str) -> dict[str, str | None]:
    [container] = operator_pod(*sets)["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def restricted_violations(pod: dict) -> list[str]:
    """What in a pod spec Pod Security "restricted" refuses (the checks a chart can get wrong)."""
    found = []
    pod_sc = pod.get("securityContext", {})
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            found.append(flag)
    containers = pod.get("initContainers", []) + pod["containers"] + pod.get("ephemeralContainers", [])
    for c in containers:
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{c['name']}: allowPrivilegeEscalation is not false")
        if sc.get("privileged"):
            found.append(f"{c['name']}: privileged")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            found.append(f"{c['name']}: capabilities.drop lacks ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{c['name']}: capabilities.add {caps['add']}")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            found.append(f"{c['name']}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            found.append(f"{c['name']}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{c['name']}: seccompProfile {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"{c['name']}: hostPort")
    return found


def notes(*sets: str) -> str:
    """What `helm install` prints after installing (NOTES.txt), without a cluster."""
    args = [tool("helm"), "install", "rel", str(CHART), "--namespace", "streamrl-system", "--dry-run=client"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("NOTES:", 1)[1]


def operator_roles(objects: dict[str, list[dict]]) -> list[dict]:
    """The operator's own Roles and ClusterRoles (not those aggregated into users' roles)."""
    return [role for role in objects.get("ClusterRole", []) + objects.get("Role", [])
            if not any(k.startswith(AGGREGATE) for k in role["metadata"]["labels"])]


def rules_of(objects: dict[str, list[dict]]) -> list[dict]:
    return [r for role in operator_roles(objects) for r in role["rules"]]


def test_lint_strict():
    out = subprocess.run([tool("helm"), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_rendered_object_is_valid_kubernetes():
    objects = render(*ALL_ON, "jobs.imagePullSecrets[0].name=regcred", "imagePullSecrets[0].name=regcred",
                     "operator.priorityClassName=system-cluster-critical", "operator.podLabels.team=rl",
                     "operator.extraEnv[0].name=HTTPS_PROXY", "operator.extraEnv[0].value=http://proxy:3128",
                     f"image.digest={DIGEST}", "operator.prometheusUrlAllow[0]=http://prometheus.monitoring:9090/",
                     "admissionPolicy.allowServiceAccounts={trainer,generator}")
    checked = 0
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, "1.33", strict=True)
            checked += 1
        except kubernetes_validate.SchemaNotFoundError:
            assert obj["apiVersion"] == MONITORING_API, obj["kind"]  # Prometheus Operator kinds
    assert checked >= 10


def test_kubernetes_older_than_1_31_is_refused():
    # The trainer's Job relies on successPolicy, on by default only from 1.31.
    old = helm_template(kube_version="1.30.0")
    assert old.returncode != 0 and ">=1.31.0-0" in old.stderr, old.stderr
    assert helm_template(kube_version="1.31.0").returncode == 0


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
    ("operator.replicas=0", "minimum: got 0, want 1"),
    ("jobs.imagePullPolicy=Always", "additional properties 'imagePullPolicy' not allowed"),
    ("jobs.imagePullSecrets[0].secretName=regcred", "additional properties 'secretName' not allowed"),
    ("networkPolicy.prometheus.ipBlock.cidr=10.0.0.0/8", "additional properties 'ipBlock' not allowed"),
    ("networkPolicy.enabled=maybe", "enabled"),
    ("operator.extraEnv[0].value=x", "name"),
    ("fullnameOverride=Not_A_Name", "fullnameOverride"),
    ("image.pullPolicy=Sometimes", "pullPolicy"),
    ("monitoring.podMonitor.interval=soon", "interval"),
    ("operator.prometheusUrl=prometheus:9090", "prometheusUrl"),
    ("operator.metricsPort=0", "metricsPort"),
    ("image.digest=latest", "digest"),
    ("image.digest=sha256:abc", "digest"),
    ("image.tag=v1 beta", "tag"),
    ("jobs.image=registry.example.com/rl@sha256:abc", "image"),
    ("jobs.cudaImage=registry.example.com/rl:1 --privileged", "cudaImage"),
    ("operator.prometheusUrlAllow[0]=prometheus.monitoring:9090/", "prometheusUrlAllow"),
    # A prefix must end its host: http://prometheus:9090 would also admit http://prometheus:9090@attacker.example
    ("operator.prometheusUrlAllow[0]=http://prometheus.monitoring:9090", "prometheusUrlAllow"),
    ("operator.prometheusUrlAllow[0]=http://attacker.example@prometheus/", "prometheusUrlAllow"),
    ("operator.prometheusUrlAllow[0]=http://a/\\,http://b/", "prometheusUrlAllow"),
    ("admissionPolicy.allowServiceAccounts[0]=Not_An_Account", "allowServiceAccounts"),
    ("admissionPolicy.enabled=maybe", "enabled"),
    ("admissionPolicy.params.x=1", "additional properties 'params' not allowed"),
    ("rbac.aggregate=yes", "aggregate"),
])
def test_values_schema_rejects_bad_values(bad, message):
    out = helm_template(bad)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_operator_runs_one_replica_recreated_non_root():
    [deployment] = by_kind(render())["Deployment"]
    spec = deployment["spec"]
    # Replicas take turns through the Lease, so a rolling update hands over rather than overlaps.
    assert spec["replicas"] == 1 and "strategy" not in spec
    [ha] = by_kind(render("operator.replicas=2"))["Deployment"]
    assert ha["spec"]["replicas"] == 2
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    assert container["image"] == "ghcr.io/streamrl/streamrl:0.1.0"
    assert container["args"][:2] == ["--log-level=INFO", "operator"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STREAMRL_PROMETHEUS_URL"] == "" and env["STREAMRL_OPERATOR_METRICS_PORT"] == "8081"
    assert env["STREAMRL_TOKEN_KEY_SECRET"] == "rel-streamrl-token-key"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"health": 8080, "metrics": 8081}


def test_operator_pod_passes_pod_security_restricted_with_an_in_memory_tmp():
    pod = operator_pod()
    assert restricted_violations(pod) == []
    [container] = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Its root filesystem is read-only: RLClusters' client certificates are written to /tmp, in memory.
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    [tmp] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert tmp["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Mi"}


def test_the_restricted_checker_catches_what_the_profile_refuses():
    pod = operator_pod()
    bad = json.loads(json.dumps(pod))
    bad["volumes"].append({"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}})
    del bad["securityContext"]["seccompProfile"]
    bad["containers"][0]["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}
    assert restricted_violations(bad) == [
        "volume docker: ['hostPath']",
        "operator: allowPrivilegeEscalation is not false",
        "operator: capabilities.drop lacks ALL",
        "operator: capabilities.add ['SYS_ADMIN']",
        "operator: seccompProfile None",
    ]
    del bad["securityContext"]["runAsNonRoot"]
    assert "operator: runAsNonRoot is not true" in restricted_violations(bad)


def test_job_images_and_pull_secrets_reach_the_operator():
    env = operator_env()
    # CPU roles run the operator's image; CUDA roles its -cuda build (docker/Dockerfile.cuda).
    assert env["STREAMRL_JOB_IMAGE"] == "ghcr.io/streamrl/streamrl:0.1.0"
    assert env["STREAMRL_JOB_CUDA_IMAGE"] == "ghcr.io/streamrl/streamrl:0.1.0-cuda"
    assert env["STREAMRL_JOB_IMAGE_PULL_SECRETS"] == ""
    env = operator_env("image.repository=registry.example.com/rl/streamrl", "image.tag=0.2.0")
    assert env["STREAMRL_JOB_IMAGE"] == "registry.example.com/rl/streamrl:0.2.0"
    assert env["STREAMRL_JOB_CUDA_IMAGE"] == "registry.example.com/rl/streamrl:0.2.0-cuda"
    pod = operator_pod("jobs.image=registry.example.com/cpu:1", "jobs.cudaImage=registry.example.com/gpu:1",
                       "jobs.imagePullSecrets[0].name=regcred", "jobs.imagePullSecrets[1].name=mirror")
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["STREAMRL_JOB_IMAGE"] == "registry.example.com/cpu:1"
    assert env["STREAMRL_JOB_CUDA_IMAGE"] == "registry.example.com/gpu:1"
    assert env["STREAMRL_JOB_IMAGE_PULL_SECRETS"] == "regcred,mirror"
    assert pod["containers"][0]["image"] == "ghcr.io/streamrl/streamrl:0.1.0"  # the operator's own is unchanged
    assert "imagePullSecrets" not in pod  # the jobs' secrets live in the jobs' namespaces
    pod = operator_pod("imagePullSecrets[0].name=operator-pull")
    assert pod["imagePullSecrets"] == [{"name": "operator-pull"}]
    assert {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}["STREAMRL_JOB_IMAGE_PULL_SECRETS"] == ""


def test_network_policy_settings_reach_the_operator():
    env = operator_env()
    assert env["STREAMRL_NETWORK_POLICY"] == "true"
    assert json.loads(env["STREAMRL_NETWORK_POLICY_PROMETHEUS"]) == DEFAULT_PROMETHEUS_PEER
    assert operator_env("networkPolicy.enabled=false")["STREAMRL_NETWORK_POLICY"] == "false"
    env = operator_env("networkPolicy.prometheus.namespaceSelector.matchLabels.team=obs",
                       "networkPolicy.prometheus.podSelector=null")
    assert json.loads(env["STREAMRL_NETWORK_POLICY_PROMETHEUS"]) == {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring", "team": "obs"}}}
    # No peer: Prometheus may not scrape job pods (the operator reads "" as none).
    assert operator_env("networkPolicy.prometheus=null")["STREAMRL_NETWORK_POLICY_PROMETHEUS"] == ""


def test_the_operator_reads_the_environment_the_chart_gives_it():
    env = operator_env("jobs.imagePullSecrets[0].name=regcred", "networkPolicy.enabled=false",
                       "operator.prometheusUrl=http://prometheus.monitoring:9090",
                       "operator.prometheusUrlAllow={http://prometheus.monitoring:9090/,https://thanos.example.com/}")
    env["STREAMRL_OPERATOR_NAMESPACE"] = "streamrl-system"  # the downward API's, on a cluster
    settings = load_settings(env)
    assert (settings.image, settings.cuda_image) == ("ghcr.io/streamrl/streamrl:0.1.0",
                                                     "ghcr.io/streamrl/streamrl:0.1.0-cuda")
    assert settings.image_pull_secrets == ("regcred",)
    assert settings.network_policy is False and settings.prometheus_peer == DEFAULT_PROMETHEUS_PEER
    assert settings.token_key_secret == "rel-streamrl-token-key"
    assert settings.prometheus_url == "http://prometheus.monitoring:9090"
    assert settings.prometheus_url_allow == ("http://prometheus.monitoring:9090/", "https://thanos.example.com/")
    assert load_settings(operator_env()).prometheus_url_allow == ()
    assert load_settings(operator_env("networkPolicy.prometheus=null")).prometheus_peer is None


def test_names_labels_priority_and_extra_env_are_values():
    objects = by_kind(render("fullnameOverride=rl-operator", "operator.priorityClassName=system-cluster-critical",
                             "operator.podLabels.team=rl", "operator.podLabels.app\\.kubernetes\\.io/name=evil",
                             "operator.extraEnv[0].name=HTTPS_PROXY", "operator.extraEnv[0].value=http://proxy:3128"))
    [deployment] = objects["Deployment"]
    assert deployment["metadata"]["name"] == "rl-operator"
    assert {r["metadata"]["name"] for r in objects["ClusterRole"]} == {
        "rl-operator-clusters", "rl-operator-jobs", "rl-operator-rljob-edit", "rl-operator-rljob-view"}
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "rl"
    # The chart's own labels win: the Deployment's selector still matches its pods.
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    [container] = pod["spec"]["containers"]
    assert container["env"][-1] == {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STREAMRL_TOKEN_KEY_SECRET"] == "rl-operator-token-key"
    [deployment] = by_kind(render("nameOverride=rl"))["Deployment"]
    assert deployment["metadata"]["name"] == "rel-rl"
    assert deployment["metadata"]["labels"]["app.kubernetes.io/name"] == "rl"
    assert "priorityClassName" not in operator_pod()


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
    rules = rules_of(objects)
    assert all("*" not in r["verbs"] and "*" not in r["resources"] for r in rules)
    # Secrets: list or watch would expose every Secret, Helm's releases too; where jobs live
    # (cluster-wide here: kube-system too) the token Secrets are applied, never read by name nor deleted.
    secrets = [r for r in rules if "secrets" in r["resources"]]
    assert secrets and not any({"list", "watch", "update", "delete"} & set(r["verbs"]) for r in secrets)
    [cluster_jobs] = [r for r in objects["ClusterRole"] if r["metadata"]["name"] == "rel-streamrl-jobs"]
    assert [r["verbs"] for r in cluster_jobs["rules"] if "secrets" in r["resources"]] == [["create", "patch"]]
    # In the operator's namespace: RLClusters' kubeconfigs and the token key (created when missing).
    [secret_role] = [r for r in objects["Role"] if any("secrets" in x["resources"] for x in r["rules"])]
    assert secret_role["metadata"]["namespace"] == "streamrl-system"
    assert secret_role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},
        # Leader election: its one Lease read and renewed by name, created when missing.
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["streamrl-operator"],
         "verbs": ["get", "patch"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    # kopf patches; nothing updates RLJobs or RLClusters (finalizers/update: owner references' blockOwnerDeletion).
    ours = [r for r in rules if r["apiGroups"] == ["streamrl.io"]]
    assert {res for r in ours for res in r["resources"]} == {
        "rljobs", "rljobs/status", "rljobs/finalizers", "rlclusters", "rlclusters/status"}
    assert all("update" not in r["verbs"] for r in ours if not r["resources"][0].endswith("/finalizers"))
    assert not any("delete" in r["verbs"] for r in ours)
    assert not any("update" in r["verbs"] for r in rules if not r["resources"][0].endswith("/finalizers"))
    # Checkpoint claims: created, never deleted by the operator (a claim not retained goes with its job).
    [claims] = [r for r in rules if "persistentvolumeclaims" in r["resources"]]
    assert "create" in claims["verbs"] and "delete" not in claims["verbs"]
    # The job's NetworkPolicy is the operator's; pods are only read (a Pending job explained, a
    # model download's last log line shown).
    [policies] = [r for r in rules if "networkpolicies" in r["resources"]]
    assert policies["apiGroups"] == ["networking.k8s.io"] and {"create", "patch", "delete"} <= set(policies["verbs"])
    [pods] = [r for r in rules if "pods" in r["resources"]]
    assert pods["verbs"] == ["get", "list"]
    [pod_logs] = [r for r in rules if "pods/log" in r["resources"]]
    assert pod_logs["resources"] == ["pods/log"] and pod_logs["verbs"] == ["get"]
    # Kueue's Workloads are only read (why a trainer Job waits for admission).
    [workloads] = [r for r in rules if "workloads" in r["resources"]]
    assert (workloads["apiGroups"], workloads["verbs"]) == (["kueue.x-k8s.io"], ["get", "list"])
    # Watching chosen namespaces: namespaced Roles there, no cluster-wide rights over jobs.
    scoped = by_kind(render("operator.watchNamespaces={team-a,team-b}"))
    job_roles = [r for r in scoped["Role"] if any("deployments" in x["resources"] for x in r["rules"])]
    assert sorted(r["metadata"]["namespace"] for r in job_roles) == ["team-a", "team-b"]
    assert all(r["rules"] == cluster_jobs["rules"] for r in job_roles)
    cluster_wide = {res for r in operator_roles(scoped) if r["kind"] == "ClusterRole"
                    for x in r["rules"] for res in x["resources"]}
    assert cluster_wide == {"rlclusters", "rlclusters/status", "namespaces"}
    [namespaces] = [x for r in operator_roles(scoped) for x in r["rules"] if "namespaces" in x["resources"]]
    assert namespaces == {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"],
                          "verbs": ["get"]}  # the cluster's id, nothing else
    named = by_kind(render("clusterId=prod-eu"))
    assert not any("namespaces" in x["resources"] for r in operator_roles(named) for x in r["rules"])
    [container] = named["Deployment"][0]["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in container["env"]}["STREAMRL_CLUSTER_ID"] == "prod-eu"
    [deployment] = scoped["Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][2:] == \
        ["--namespace=team-a", "--namespace=team-b"]


def test_monitoring_needs_the_prometheus_operator_api():
    # Enabled on a cluster without the Prometheus Operator: skipped (an install would fail on them), and said so.
    out = helm_template(*ALL_ON, prometheus_operator=False)
    assert out.returncode == 0, out.stderr
    assert {"PodMonitor", "PrometheusRule"}.isdisjoint(o["kind"] for o in yaml.safe_load_all(out.stdout) if o)
    assert {"PodMonitor", "PrometheusRule"} <= set(by_kind(render(*ALL_ON, prometheus_operator=True)))
    assert {"PodMonitor", "PrometheusRule"}.isdisjoint(by_kind(render(prometheus_operator=True)))
    assert "serves no monitoring.coreos.com/v1" in notes(ALL_ON[0])
    assert "monitoring.coreos.com" not in notes()


def test_notes_apply_the_example_of_the_installed_version():
    text = notes("jobs.imagePullSecrets[0].name=regcred")
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    [url] = re.findall(r"https://raw\.githubusercontent\.com/\S+", text)
    assert url == f"https://raw.githubusercontent.com/streamrl/streamrl/v{app_version}/deploy/examples/rljob-tiny-cpu.yaml"
    # The job pull secret is not copied by the operator: said at install.
    assert "Job pods pull with the Secret(s) regcred" in text and "regcred" not in notes()


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


def test_an_image_digest_pins_the_operator_and_the_cpu_jobs():
    pod = operator_pod(f"image.digest={DIGEST}", "image.tag=0.2.0")
    [container] = pod["containers"]
    assert container["image"] == f"ghcr.io/streamrl/streamrl@{DIGEST}"  # the tag is not used
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STREAMRL_JOB_IMAGE"] == f"ghcr.io/streamrl/streamrl@{DIGEST}"
    # The CUDA build is another image: image.digest is not its digest; pinned through jobs.cudaImage.
    assert env["STREAMRL_JOB_CUDA_IMAGE"] == "ghcr.io/streamrl/streamrl:0.2.0-cuda"
    cuda = f"registry.example.com/rl/streamrl-cuda@{DIGEST}"
    env = operator_env(f"image.digest={DIGEST}", f"jobs.cudaImage={cuda}",
                       "jobs.image=registry.example.com/rl/streamrl:1.0@" + DIGEST)
    assert env["STREAMRL_JOB_CUDA_IMAGE"] == cuda
    assert env["STREAMRL_JOB_IMAGE"] == "registry.example.com/rl/streamrl:1.0@" + DIGEST


def test_prometheus_url_allow_list_reaches_the_operator():
    assert operator_env()["STREAMRL_PROMETHEUS_URL_ALLOW"] == ""  # no job may name its own Prometheus
    env = operator_env("operator.prometheusUrlAllow={http://prometheus-operated.monitoring.svc:9090/,https://t.example/}")
    assert env["STREAMRL_PROMETHEUS_URL_ALLOW"] == "http://prometheus-operated.monitoring.svc:9090/,https://t.example/"


def test_users_rights_on_rljobs_are_aggregated_into_edit_and_view():
    roles = {r["metadata"]["name"]: r for r in by_kind(render())["ClusterRole"]}
    edit, view = roles["rel-streamrl-rljob-edit"], roles["rel-streamrl-rljob-view"]
    assert {k: v for k, v in edit["metadata"]["labels"].items() if k.startswith(AGGREGATE)} == {
        AGGREGATE + "edit": "true", AGGREGATE + "admin": "true"}
    assert edit["rules"] == [
        {"apiGroups": ["streamrl.io"], "resources": ["rljobs"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["streamrl.io"], "resources": ["rljobs/scale"], "verbs": ["get", "update", "patch"]}]
    assert {k: v for k, v in view["metadata"]["labels"].items() if k.startswith(AGGREGATE)} == {
        AGGREGATE + "view": "true"}
    assert view["rules"] == [{"apiGroups": ["streamrl.io"], "resources": ["rljobs", "rlclusters"],
                              "verbs": ["get", "list", "watch"]}]
    # Nobody is given RLClusters' writes, nor status writes, by aggregation.
    assert not any("rlclusters" in r["resources"] or "rljobs/status" in r["resources"] for r in edit["rules"])
    names = {r["metadata"]["name"] for r in by_kind(render("rbac.aggregate=false"))["ClusterRole"]}
    assert names == {"rel-streamrl-clusters", "rel-streamrl-jobs"}


# ---- the admission policy on RLJobs' pod templates (review S2-3), its CEL run by cel-python ----
