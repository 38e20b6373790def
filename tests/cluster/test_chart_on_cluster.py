"""The Helm chart installed on a real cluster (kind or k3d), the operator running from its image:
what the emulator of tests/integration/operator cannot show. A tiny job runs to Succeeded in a
namespace under Pod Security "restricted", then holds no pod and is never trained again; the
CRD's CEL name rule and the chart's admission policy refuse at create; /scale works; and the
job's NetworkPolicy keeps other tenants off the trainer's gRPC port.

    docker build -f docker/Dockerfile -t streamrl:dev . && kind load docker-image streamrl:dev
    STREAMRL_IMAGE=streamrl:dev make test-cluster          (docs/kubernetes-cluster-tests.md)

Skipped without KUBECONFIG, and on a context named neither kind-* nor k3d-* unless
STREAMRL_CLUSTER_ANY_CONTEXT=1: it installs cluster-scoped objects (the CRDs, kept afterwards
as the chart keeps them; an admission policy; ClusterRoles). Everything else it makes, in
namespaces of its own, is removed at the end (not with STREAMRL_CLUSTER_KEEP=1, for a look).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from tests.k8stools import tool

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG does not point at a cluster")]
ROOT = Path(__file__).resolve().parents[2]
CHART, CRDS = ROOT / "helm" / "streamrl", ROOT / "helm" / "streamrl" / "files" / "crds"
EXAMPLE = ROOT / "deploy" / "examples" / "rljob-tiny-cpu.yaml"
IMAGE = os.environ.get("STREAMRL_IMAGE") or "ghcr.io/streamrl/streamrl:0.1.0"
JOB_TIMEOUT_S = float(os.environ.get("STREAMRL_CLUSTER_TIMEOUT_S") or 900)
"""How long the tiny job may take to succeed (image pulls and a laptop's CPUs included)."""
RLJOBS = "rljobs.streamrl.io"
API = "/apis/streamrl.io/v1alpha1"
TRAINER_GRPC_PORT = 50051
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}
T = TypeVar("T")

PROBE = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][:2]
except OSError as err:
    print("unresolved:", err)
    sys.exit(2)
try:
    socket.create_connection(address, timeout=3).close()
except OSError as err:
    print("not connected:", err)
    sys.exit(1)
print("connected")
"""
"""A TCP connect from a pod: exit 0 connected, 1 not (refused, dropped), 2 the name did not resolve."""
CONNECTED, NOT_CONNECTED = 0, 1


def run(*args: str, input: str | None = None, timeout_s: float = 180,
        check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(args, input=input, capture_output=True, text=True, timeout=timeout_s)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(args[:4])}... failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def kubectl(*args: str, **kw) -> subprocess.CompletedProcess:
    return run(tool("kubectl"), *args, **kw)


def get(*args: str) -> dict | None:
    """`kubectl get ... -o json`; None when not found."""
    out = kubectl("get", *args, "-o", "json", check=False)
    if out.returncode != 0:
        assert "NotFound" in out.stderr or "not found" in out.stderr, out.stderr
        return None
    return json.loads(out.stdout)


def until(check: Callable[[], T | None], timeout_s: float, what: str, why: Callable[[], str] = str) -> T:
    """`check()`'s first truthy value, tried every 2 s; AssertionError naming `what` (and `why()`) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if result := check():
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{why()}")
        time.sleep(2)


def image_values(ref: str) -> list[str]:
    """--set values that run the operator and every CPU job role from the image `ref`."""
    if "@" in ref:
        repository, digest = ref.split("@", 1)
        sets = [f"image.repository={repository}", f"image.digest={digest}"]
    else:
        head, _, tag = ref.rpartition(":")
        repository, tag = (head, tag) if head and "/" not in tag else (ref, "latest")
        sets = [f"image.repository={repository}", f"image.tag={tag}"]
    return [*sets, f"jobs.image={ref}"]


def tiny_job(name: str, namespace: str, num_iterations: int = 3, warm_start_steps: int = 50) -> dict:
    """deploy/examples/rljob-tiny-cpu.yaml renamed, shortened to finish in minutes on a laptop."""
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"] = {"name": name, "namespace": namespace}
    job["spec"]["algorithm"]["numIterations"] = num_iterations
    job["spec"]["model"]["warmStartSteps"] = warm_start_steps
    return job


@dataclass(frozen=True)
class Install:
    """One release of the chart and the namespaces the suite made."""

    release: str
    operator_ns: str
    jobs_ns: str
    """Pod Security "restricted"; the operator watches only it (its RBAC is Roles there)."""
    tenant_ns: str
    """Another tenant's namespace."""

    @property
    def policy(self) -> str:
        return f"{self.release}-streamrl-rljob-templates"

    def snapshot(self) -> str:
        """What a failed wait shows: the jobs namespace's objects, its recent events, the operator's log."""
        parts = [kubectl("get", "rljobs,deployments,jobs,pods,services,networkpolicies", "-n", self.jobs_ns, "-o",
                         "wide", check=False).stdout,
                 kubectl("get", "events", "-n", self.jobs_ns, "--sort-by=.lastTimestamp", check=False).stdout[-4000:],
                 kubectl("logs", "-n", self.operator_ns, f"deployment/{self.release}-streamrl", "--tail=80",
                         check=False).stdout]
        return "\n".join(parts)

    def job(self, name: str) -> dict | None:
        return get(RLJOBS, name, "-n", self.jobs_ns)


def _create_namespace(name: str, labels: dict[str, str]) -> None:
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": name, "labels": labels}}))


def _delete_jobs(namespace: str) -> None:
    """RLJobs carry the operator's finalizer: deleted while it runs, else their finalizers dropped."""
    if kubectl("delete", RLJOBS, "--all", "-n", namespace, "--wait=true", "--timeout=180s", check=False).returncode:
        left = kubectl("get", RLJOBS, "-n", namespace, "-o", "json", check=False)
        for job in json.loads(left.stdout)["items"] if left.returncode == 0 else []:
            kubectl("patch", RLJOBS, job["metadata"]["name"], "-n", namespace, "--type=merge",
                    "-p", '{"metadata":{"finalizers":null}}', check=False)


@pytest.fixture(scope="module")
def install():
    context = kubectl("config", "current-context").stdout.strip()
    if not context.startswith(("kind-", "k3d-")) and os.environ.get("STREAMRL_CLUSTER_ANY_CONTEXT") != "1":
        pytest.skip(f"context {context!r} is not a kind or k3d cluster: this suite installs cluster-scoped objects; "
                    "set STREAMRL_CLUSTER_ANY_CONTEXT=1 to run it there anyway")
    suffix = uuid.uuid4().hex[:6]
    it = Install(f"srl-{suffix}", f"streamrl-op-{suffix}", f"streamrl-jobs-{suffix}", f"streamrl-tenant-{suffix}")
    try:
        for ns in (it.operator_ns, it.jobs_ns, it.tenant_ns):
            _create_namespace(ns, RESTRICTED)
        # The CRDs are cluster-wide and kept by the release that made them: the chart installs them
        # the first time; after that they are brought up to this checkout's and the release skips them.
        crds_there = get("crd", RLJOBS) is not None
        if crds_there:
            kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
        sets = [*image_values(IMAGE), "networkPolicy.prometheus=null",
                f"operator.watchNamespaces={{{it.jobs_ns}}}", f"crds.install={str(not crds_there).lower()}"]
        helm = run(tool("helm"), "upgrade", "--install", it.release, str(CHART), "--namespace", it.operator_ns,
                   "--wait", "--timeout", "5m", *[a for s in sets for a in ("--set", s)], timeout_s=360, check=False)
        assert helm.returncode == 0, f"helm install failed:\n{helm.stderr}\n{it.snapshot()}"
        yield it
    finally:
        if os.environ.get("STREAMRL_CLUSTER_KEEP") != "1":
            _delete_jobs(it.jobs_ns)
            kubectl("delete", "namespace", it.jobs_ns, it.tenant_ns, "--wait=true", "--timeout=180s", check=False)
            run(tool("helm"), "uninstall", it.release, "--namespace", it.operator_ns, "--wait", check=False)
            kubectl("delete", "namespace", it.operator_ns, "--wait=false", check=False)


def _create(job: dict, *args: str) -> subprocess.CompletedProcess:
    """`kubectl create` of `job`, logging each request's HTTP status (-v=6) on stderr."""
    return kubectl("create", "-f", "-", "-v=6", *args, input=json.dumps(job), check=False)


def test_a_job_named_7b_test_is_refused_at_create_by_the_crd_name_rule(install):
    out = _create(tiny_job("7b-test", install.jobs_ns))
    assert out.returncode != 0
    assert "422 Unprocessable Entity" in out.stderr, out.stderr
    assert "metadata.name must be a DNS-1035 label" in out.stderr, out.stderr
    assert install.job("7b-test") is None


def test_the_admission_policy_refuses_a_hostpath_template_and_admits_the_example(install):
    # cel-go, not cel-python, on the object as the API server holds it (after the CRD's defaults).
    good = tiny_job("admitted", install.jobs_ns)
    bad = tiny_job("hostpath", install.jobs_ns)
    bad["spec"]["generators"]["pools"][0]["placement"] = {"template": {"spec": {"volumes": [
        {"name": "root", "hostPath": {"path": "/"}}]}}}
    expected = "spec.generators.pools[*].placement.template: hostPath volumes are not allowed"
    # A new binding takes effect within seconds (the API server's informers).
    refused = until(lambda: (out := _create(bad, "--dry-run=server")).returncode and expected in out.stderr and out,
                    60, "the policy to refuse a hostPath template")
    assert "422 Unprocessable Entity" in refused.stderr, refused.stderr
    assert install.policy in refused.stderr
    admitted = _create(good, "--dry-run=server")
    assert admitted.returncode == 0, admitted.stderr


def test_a_tiny_job_succeeds_then_holds_no_pod_and_is_never_trained_again(install):
    ns, name = install.jobs_ns, "tiny"
    kubectl("create", "-f", "-", input=json.dumps(tiny_job(name, ns)))

    def finished() -> str | None:
        phase = ((install.job(name) or {}).get("status") or {}).get("phase")
        if phase in ("Failed", "Invalid"):
            raise AssertionError(f"the job ended {phase}: {install.job(name)['status']}\n{install.snapshot()}")
        return phase if phase == "Succeeded" else None

    until(finished, JOB_TIMEOUT_S, "phase Succeeded (STREAMRL_CLUSTER_TIMEOUT_S)", install.snapshot)
    # Over: every Deployment of the job (the generators, a ranker) at 0 replicas; no GPU kept.
    def deployments() -> list[dict]:
        return get("deployments", "-n", ns, "-l", f"streamrl.io/job={name}")["items"]

    assert any(d["metadata"]["name"] == f"{name}-gen-default" for d in deployments())
    until(lambda: all(d["spec"]["replicas"] == 0 for d in deployments()), 60,
          "the finished job's Deployments at 0 replicas", install.snapshot)
    # The trainer Job deleted after the end is not created again (three status rounds), and the
    # job stays Succeeded.
    assert get("job", f"{name}-trainer", "-n", ns) is not None
    kubectl("delete", "job", f"{name}-trainer", "-n", ns, "--wait=true", "--timeout=120s")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert get("job", f"{name}-trainer", "-n", ns) is None, "the finished job's trainer was created again"
        assert install.job(name)["status"]["phase"] == "Succeeded"
        time.sleep(3)


@pytest.fixture(scope="module")
def running_job(install) -> str:
    """A job that runs for as long as the module needs it (deleted with the namespace)."""
    name = "long"
    kubectl("create", "-f", "-", input=json.dumps(tiny_job(name, install.jobs_ns, num_iterations=100_000)))
    return name


def test_scale_subresource_reads_and_writes_the_generators(install, running_job):
    ns, name = install.jobs_ns, running_job
    path = f"{API}/namespaces/{ns}/rljobs/{name}/scale"

    def scale() -> dict | None:  # "spec replicas field does not exist" until the operator sets it
        out = kubectl("get", "--raw", path, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    current = until(lambda: (s := scale()) and s.get("status", {}).get("selector") and s, 120,
                    "the /scale subresource (spec.generators.replicas set by the operator)", install.snapshot)
    assert current["spec"]["replicas"] == 1
    assert current["status"]["selector"] == f"streamrl.io/job={name},streamrl.io/role=generator"
    kubectl("scale", RLJOBS, name, "-n", ns, "--replicas=2")
    until(lambda: (get("deployment", f"{name}-gen-default", "-n", ns) or {}).get("spec", {}).get("replicas") == 2,
          60, "the pool's Deployment at the scaled 2 replicas", install.snapshot)
    assert install.job(name)["spec"]["generators"]["replicas"] == 2


def probe_pod(pod: str, namespace: str, labels: dict[str, str], host: str) -> dict:
    """A pod that runs PROBE against host:TRAINER_GRPC_PORT once; Pod Security "restricted"
    compliant, from the suite's image (already on the nodes)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": namespace, "labels": labels},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{"name": "probe", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                                     "command": ["python", "-c", PROBE, host, str(TRAINER_GRPC_PORT)],
                                     "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                                     "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                                     "securityContext": {"allowPrivilegeEscalation": False,
                                                         "readOnlyRootFilesystem": True,
                                                         "capabilities": {"drop": ["ALL"]}}}]}}


def _probe(install: Install, namespace: str, labels: dict[str, str], host: str) -> tuple[int, str]:
    """(exit code of PROBE, its output) from a fresh probe_pod in `namespace` carrying `labels`."""
    pod = f"probe-{uuid.uuid4().hex[:6]}"
    kubectl("create", "-f", "-", input=json.dumps(probe_pod(pod, namespace, labels, host)))
    try:
        done = until(lambda: (p := get("pod", pod, "-n", namespace)) and p["status"].get("phase") in (
            "Succeeded", "Failed") and p, 180, f"the probe pod {namespace}/{pod}", install.snapshot)
        code = done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
        return code, kubectl("logs", pod, "-n", namespace, check=False).stdout.strip()
    finally:
        kubectl("delete", "pod", pod, "-n", namespace, "--wait=false", check=False)


def test_only_the_jobs_own_pods_reach_the_trainer_grpc_port(install, running_job):
    ns, name = install.jobs_ns, running_job
    host = f"{name}-trainer.{ns}.svc"

    def trainer_ready() -> bool:
        pods = get("pods", "-n", ns, "-l", f"streamrl.io/job={name},streamrl.io/role=trainer")["items"]
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for p in pods for c in p["status"].get("conditions", []))

    until(trainer_ready, JOB_TIMEOUT_S, "the trainer pod Ready", install.snapshot)
    own = {"streamrl.io/job": name}
    code, said = _probe(install, ns, own, host)
    if code != CONNECTED:  # one more try: a Service's endpoints can trail the pod's readiness
        code, said = _probe(install, ns, own, host)
    assert code == CONNECTED, f"a pod of the job's namespace labelled streamrl.io/job={name}: {said}"
    code, said = _probe(install, ns, {}, host)
    assert code in (CONNECTED, NOT_CONNECTED), said
    if code == CONNECTED:
        pytest.skip("the cluster's network enforces no NetworkPolicy (an unlabelled pod of the job's namespace "
                    "reached the trainer): use kind v0.24+ (kindnet) or k3s with its network-policy controller")
    # Another tenant, even with the job's label: the policy's pod selector is the job's namespace only.
    code, said = _probe(install, install.tenant_ns, own, host)
    assert code == NOT_CONNECTED, f"a pod of another namespace reached {host}:{TRAINER_GRPC_PORT}: {said}"


def test_an_edit_adding_what_the_checkpoints_hold_to_a_job_created_without_it_is_refused(install, running_job):
    """N11: algorithm and task default to {}, so their leaves are stored and the transition rule sees them."""
    patch = json.dumps({"spec": {"algorithm": {"promptsPerStep": 64}}})
    out = kubectl("patch", "rljob", running_job, "-n", install.jobs_ns, "--type=merge", "-p", patch, check=False)
    assert out.returncode != 0 and "algorithm.promptsPerStep is immutable" in out.stderr, out.stderr


def test_one_operator_replica_holds_the_lease_and_the_cluster_id_is_kube_systems_uid(install):
    lease = until(lambda: get("lease", "streamrl-operator", "-n", install.operator_ns), 60, "the operator's Lease")
    holder = lease["spec"]["holderIdentity"]
    pods = get("pods", "-n", install.operator_ns, "-l", "app.kubernetes.io/component=operator")["items"]
    assert holder in {p["metadata"]["name"] for p in pods}, (holder, pods)
    uid = get("namespace", "kube-system")["metadata"]["uid"]
    logs = kubectl("logs", "-n", install.operator_ns, holder).stdout
    assert f"as cluster {uid}" in logs, logs[-2000:]


def test_a_field_an_earlier_operator_wrote_is_taken_over_and_pruned_on_a_real_server(install, running_job):
    """N26 where the real server keeps managedFields: the generator Deployment as an operator
    before server-side apply left it (python-httpx owning every field), then a label the
    operator never applies co-owned that way is handed over and pruned by the next apply."""
    ns, deployment = install.jobs_ns, f"{running_job}-gen-default"
    current = get("deployment", deployment, "-n", ns)
    entries = current["metadata"]["managedFields"]
    mine = next(e for e in entries if e["manager"] == "streamrl-operator" and e["operation"] == "Apply")
    legacy = {**mine, "manager": "python-httpx", "operation": "Update"}
    legacy["fieldsV1"] = {**mine["fieldsV1"], "f:metadata": {**mine["fieldsV1"].get("f:metadata", {}),
                                                             "f:annotations": {".": {}, "f:streamrl.io/legacy": {}}}}
    kubectl("annotate", "deployment", deployment, "-n", ns, "streamrl.io/legacy=1")
    current = get("deployment", deployment, "-n", ns)
    patch = [{"op": "replace", "path": "/metadata/managedFields",
              "value": [e for e in current["metadata"]["managedFields"] if e["manager"] != "kubectl-annotate"]
              + [legacy]}]
    kubectl("patch", "deployment", deployment, "-n", ns, "--type=json", "-p", json.dumps(patch))
    until(lambda: "streamrl.io/legacy" not in ((get("deployment", deployment, "-n", ns) or {})["metadata"]
                                               .get("annotations") or {}) or None, 120,
          "the legacy annotation pruned", install.snapshot)
    managers = {e["manager"] for e in get("deployment", deployment, "-n", ns)["metadata"]["managedFields"]}
    assert "python-httpx" not in managers, managers
