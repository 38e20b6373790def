"""The chart's admission policy on RLJobs' pod templates, rendered by the real helm binary and
its CEL evaluated by cel-python: it matches RLJob writes and fails closed, covers every pod
template the CRD has, admits the examples and harmless templates, and refuses a template
that reaches the node (host namespaces, privilege, host paths...)."""

from __future__ import annotations

import json
from pathlib import Path

import celpy
import pytest
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel

from streamrl.operator.crd import rljob_crd
from streamrl.operator.validate import apply_defaults
from tests.k8stools import by_kind, render

ROOT = Path(__file__).resolve().parents[2]


TEMPLATES = {"trainer": "spec.trainer.placement.template", "ranker": "spec.ranker.placement.template",
             "pools": "spec.generators.pools[*].placement.template"}
RULES = {"hostNetwork": "spec.hostNetwork: true is not allowed", "hostPID": "spec.hostPID: true is not allowed",
         "hostIPC": "spec.hostIPC: true is not allowed", "hostPath": "hostPath volumes are not allowed",
         "privileged": "privileged containers are not allowed", "capabilities": "added capabilities are not allowed",
         "serviceAccount": "spec.serviceAccountName (and the deprecated spec.serviceAccount) must be one of",
         "hostPort": "host ports are not allowed", "seLinux": "seLinuxOptions may set only level",
         "procMount": "procMount other than Default is not allowed",
         "unconfined": "seccompProfile and appArmorProfile of type Unconfined are not allowed",
         "sysctls": "only the sysctls Pod Security baseline calls safe are allowed",
         "root": "running as root is not allowed", "hostProcess": "Windows host processes are not allowed",
         "nodeName": "spec.nodeName is not allowed", "runtimeClass": "spec.runtimeClassName must be one of [nvidia]"}
BAD_TEMPLATES = [
    ("hostNetwork", {"spec": {"hostNetwork": True}}),
    ("hostPID", {"spec": {"hostPID": True}}),
    ("hostIPC", {"spec": {"hostIPC": True}}),
    ("hostPath", {"spec": {"volumes": [{"name": "scratch", "emptyDir": {}},
                                       {"name": "root", "hostPath": {"path": "/"}}]}}),
    ("privileged", {"spec": {"containers": [{"name": "main", "securityContext": {"privileged": True}}]}}),
    ("privileged", {"spec": {"initContainers": [{"name": "setup", "image": "busybox"},
                                                {"name": "mount", "securityContext": {"privileged": True}}]}}),
    ("capabilities", {"spec": {"containers": [{"name": "main", "securityContext": {
        "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}}]}}),
    ("capabilities", {"spec": {"initContainers": [{"name": "setup", "securityContext": {
        "capabilities": {"add": ["SYS_ADMIN"]}}}]}}),
    ("serviceAccount", {"spec": {"serviceAccountName": "cluster-admin"}}),
    ("serviceAccount", {"spec": {"serviceAccount": "cluster-admin"}}),  # deprecated alias, same effect
    # N13: the rest of Pod Security "baseline", and restricted's non-root (a namespace may enforce none)
    ("hostPort", {"spec": {"containers": [{"name": "main", "ports": [{"containerPort": 80, "hostPort": 80}]}]}}),
    ("seLinux", {"spec": {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}}),
    ("seLinux", {"spec": {"containers": [{"name": "main", "securityContext": {"seLinuxOptions": {"user": "root"}}}]}}),
    ("procMount", {"spec": {"containers": [{"name": "main", "securityContext": {"procMount": "Unmasked"}}]}}),
    ("unconfined", {"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}}),
    ("unconfined", {"spec": {"initContainers": [{"name": "i", "securityContext": {
        "appArmorProfile": {"type": "Unconfined"}}}]}}),
    ("sysctls", {"spec": {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}}),
    ("root", {"spec": {"containers": [{"name": "sidecar", "securityContext": {"runAsUser": 0}}]}}),
    ("root", {"spec": {"securityContext": {"runAsNonRoot": False}}}),
    ("hostProcess", {"spec": {"containers": [{"name": "main", "securityContext": {
        "windowsOptions": {"hostProcess": True}}}]}}),
    ("nodeName", {"spec": {"nodeName": "control-plane-1"}}),
    ("runtimeClass", {"spec": {"runtimeClassName": "privileged-runc"}}),
]
HARMLESS_TEMPLATE = {
    "metadata": {"labels": {"team": "rl"}, "annotations": {"a": "b"}},
    "spec": {"hostNetwork": False, "hostPID": False, "serviceAccountName": "trainer", "runtimeClassName": "nvidia",
             "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"},
                                 "seLinuxOptions": {"level": "s0:c1,c2", "type": "container_t"},
                                 "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]},
             "affinity": {"nodeAffinity": {}},
             "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
             "initContainers": [{"name": "fetch", "image": "busybox", "securityContext": {"privileged": False}}],
             "containers": [{"name": "main", "env": [{"name": "A", "value": "1"}],
                             "ports": [{"containerPort": 9000}, {"containerPort": 9001, "hostPort": 0}],
                             "securityContext": {"procMount": "Default",
                 "privileged": False, "capabilities": {"drop": ["ALL"], "add": []}}},
                 {"name": "sidecar", "image": "busybox"}]},
}


def _rljobs_of_examples() -> list[tuple[str, dict]]:
    return [(f"{path.name}#{i}", doc) for path in sorted((ROOT / "deploy" / "examples").glob("rljob-*.yaml"))
            for i, doc in enumerate(yaml.safe_load_all(path.read_text())) if doc and doc.get("kind") == "RLJob"]


def _with_template(job: dict, where: str, template: dict) -> dict:
    """A copy of `job` with `template` at one of TEMPLATES (pools: in an extra pool, after good ones)."""
    job = json.loads(json.dumps(job))
    spec = job["spec"]
    if where == "pools":
        spec["generators"]["pools"].append({"name": "extra", "replicas": 1, "placement": {"template": template}})
    else:
        spec.setdefault(where, {}).setdefault("placement", {})["template"] = template
    return job


class AdmissionPolicy:
    """The chart's ValidatingAdmissionPolicy, its expressions compiled by cel-python."""

    def __init__(self, policy: dict):
        env = celpy.Environment()
        self.policy = policy
        self.validations = [(env.program(env.compile(v["expression"])), v["message"])
                            for v in policy["spec"]["validations"]]
        [condition] = policy["spec"]["matchConditions"]
        self.condition = env.program(env.compile(condition["expression"]))

    @staticmethod
    def _bool(program, **bindings) -> bool:
        result = program.evaluate({k: json_to_cel(v) for k, v in bindings.items()})
        # An error would refuse the request on a real server (failurePolicy Fail): here it is a bug.
        assert isinstance(result, celtypes.BoolType), f"did not evaluate to a bool: {result!r}"
        return bool(result)

    def refusals(self, job: dict) -> list[str]:
        """The message of every validation `job` fails ([] = admitted)."""
        return [message for program, message in self.validations if not self._bool(program, object=job)]

    def applies(self, operation: str, job: dict, old: dict | None = None) -> bool:
        return self._bool(self.condition, request={"operation": operation}, object=job, oldObject=old)


def admission_policy(*sets: str) -> AdmissionPolicy:
    objects = by_kind(render(*sets))
    [policy], [binding] = objects["ValidatingAdmissionPolicy"], objects["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    return AdmissionPolicy(policy)


def test_admission_policy_matches_rljob_writes_and_fails_closed():
    objects = by_kind(render())
    [policy] = objects["ValidatingAdmissionPolicy"]
    assert policy["metadata"]["name"] == "rel-streamrl-rljob-templates"
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail" and "paramKind" not in spec
    assert spec["matchConstraints"]["resourceRules"] == [{"apiGroups": ["streamrl.io"], "apiVersions": ["*"],
                                                          "operations": ["CREATE", "UPDATE"], "resources": ["rljobs"]}]
    # 3 templates x 6 rules, each message naming its template and its field.
    # 3 templates x 15 rules: host namespaces, hostPath, privilege, capabilities, and the rest of baseline
    assert len(spec["validations"]) == 45 and all(v["reason"] == "Invalid" for v in spec["validations"])
    node_rules = [message for rule, message in RULES.items() if rule != "serviceAccount"]  # no list: any account
    assert {(t, r) for t in TEMPLATES.values() for r in node_rules} == {
        (v["message"].split(": ", 1)[0], next(r for r in RULES.values() if r in v["message"]))
        for v in spec["validations"]}
    assert "ValidatingAdmissionPolicy" not in by_kind(render("admissionPolicy.enabled=false"))
    assert "ValidatingAdmissionPolicyBinding" not in by_kind(render("admissionPolicy.enabled=false"))


def test_admission_policy_covers_every_pod_template_of_the_crd():
    def templates(node: dict, path: str) -> list[str]:
        found = [path] if path.endswith(".template") and node.get("x-kubernetes-preserve-unknown-fields") else []
        for key, sub in node.get("properties", {}).items():
            found += templates(sub, f"{path}.{key}" if path else key)
        if "items" in node:
            found += templates(node["items"], path + "[*]")
        return found

    schema = rljob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert sorted(templates(schema, "")) == sorted(TEMPLATES.values())


def test_admission_policy_admits_the_examples_and_harmless_templates():
    policy = admission_policy("admissionPolicy.allowServiceAccounts={trainer,generator}")
    schema = rljob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    examples = _rljobs_of_examples()
    assert len(examples) >= 4
    for source, job in examples:
        assert policy.refusals(job) == [], source
        assert policy.refusals(apply_defaults(schema, json.loads(json.dumps(job)))) == [], source  # as stored
        for where in TEMPLATES:
            assert policy.refusals(_with_template(job, where, HARMLESS_TEMPLATE)) == [], (source, where)
            assert policy.refusals(_with_template(job, where, {})) == [], (source, where)
            assert policy.refusals(_with_template(job, where, {"spec": {}})) == [], (source, where)


@pytest.mark.parametrize("where", TEMPLATES)
@pytest.mark.parametrize("rule, template", BAD_TEMPLATES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(BAD_TEMPLATES)])
def test_admission_policy_refuses_a_template_that_reaches_the_node(where, rule, template):
    tiny = yaml.safe_load((ROOT / "deploy" / "examples" / "rljob-tiny-cpu.yaml").read_text())
    job = _with_template(tiny, where, template)
    expected = f"{TEMPLATES[where]}: {RULES[rule]}"
    refusals = admission_policy("admissionPolicy.allowServiceAccounts={trainer,generator}").refusals(job)
    assert len(refusals) == 1 and refusals[0].startswith(expected), refusals
    if rule == "serviceAccount":
        assert refusals[0].endswith("must be one of trainer, generator (admissionPolicy.allowServiceAccounts)")
        # Without a list, any of the namespace's accounts may be named.
        assert admission_policy().refusals(job) == []
    else:
        assert admission_policy().refusals(job) == [refusals[0]]


def test_admission_policy_checks_creates_and_spec_changes_only():
    policy = admission_policy()
    job = yaml.safe_load((ROOT / "deploy" / "examples" / "rljob-tiny-cpu.yaml").read_text())
    assert policy.applies("CREATE", job)
    # kopf's and the operator's metadata writes (finalizers, annotations) to a job made before
    # the policy still go through; a spec change is checked.
    annotated = {**job, "metadata": {**job["metadata"], "finalizers": ["streamrl.io/finalizer"]}}
    assert not policy.applies("UPDATE", annotated, job)
    scaled = json.loads(json.dumps(job))
    scaled["spec"]["generators"]["replicas"] = 3
    assert policy.applies("UPDATE", scaled, job)
