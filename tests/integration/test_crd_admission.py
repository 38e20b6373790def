"""The CRDs the chart ships pass what the API server checks when a CRD is created
(tests/crd_admission.py), and each of those checks refuses what the API server refuses, with
its words. The first test is the one that `helm install` failed on: a root rule's fieldPath
through a metadata that declared no name."""

from __future__ import annotations

import copy

import pytest

from streamrl.operator.crd import rljob_crd
from streamrl.operator.validate import update_problems
from tests import crd_admission
from tests.k8stools import by_kind, render

ROOT_SCHEMA = "spec.versions[0].schema.openAPIV3Schema"
MINIMAL_JOB = {"apiVersion": "streamrl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "grpo"},
               "spec": {"model": {"source": "builtin-tiny"}}}


def _crd(schema: dict) -> dict:
    """A one-version CRD around `schema` (its root)."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "things.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"kind": "Thing", "plural": "things"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": schema}}]}}


def _with_spec(spec: dict, rules: list[dict] | None = None) -> dict:
    spec = dict(spec, **({"x-kubernetes-validations": rules} if rules else {}))
    return _crd({"type": "object", "properties": {"metadata": {"type": "object"}, "spec": spec}})


def test_the_rljob_crd_before_the_fix_is_refused_as_the_api_server_refused_it():
    """37d3310's CRD: `fieldPath: .metadata.name` on the root rule, metadata `{type: object}`."""
    crd = rljob_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["metadata"] = {"type": "object"}
    assert crd_admission.refusal(crd) == (
        'CustomResourceDefinition.apiextensions.k8s.io "rljobs.streamrl.io" is invalid: '
        f'{ROOT_SCHEMA}.x-kubernetes-validations[0].fieldPath: Invalid value: ".metadata.name": must be a valid path')


def test_every_crd_the_chart_ships_is_created():
    crds = by_kind(render())["CustomResourceDefinition"]
    assert sorted(c["metadata"]["name"] for c in crds) == ["rlclusters.streamrl.io", "rljobs.streamrl.io"]
    for crd in crds:
        assert crd_admission.problems(crd) == [], crd["metadata"]["name"]


def test_the_rljob_rules_cost_a_small_share_of_the_budgets():
    """The budgets: 10M a rule and 100M a CRD (conservatively priced here). Ours are far below,
    so a new rule or a longer bound is the only way to get near them: this pins the headroom."""
    [walk] = crd_admission.schema_walk(rljob_crd())
    assert max(walk.costs.values()) < crd_admission.PER_RULE_LIMIT / 100
    assert walk.total_cost < crd_admission.PER_CRD_LIMIT / 1000
    assert len(walk.costs) >= 25  # every rule was priced, not skipped


@pytest.mark.parametrize("schema, expected", [
    ({"type": "object", "properties": {"spec": {"properties": {"a": {"type": "string"}}}}},
     f"{ROOT_SCHEMA}.properties[spec].type: Required value: must not be empty for specified object fields"),
    ({"type": "object", "properties": {"spec": {"type": "array"}}},
     f"{ROOT_SCHEMA}.properties[spec].items: Required value: must be specified"),
    ({"type": "object", "properties": {"metadata": {"type": "object", "properties": {
        "labels": {"type": "object"}}}}},
     f"{ROOT_SCHEMA}.properties[metadata]: Forbidden: must not specify anything other than name and generateName, "
     "but metadata is implicitly specified"),
    ({"type": "object", "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}},
                                                "additionalProperties": {"type": "string"}}}},
     f"{ROOT_SCHEMA}.properties[spec].additionalProperties: Forbidden: additionalProperties and properties are "
     "mutual exclusive"),
    ({"type": "object", "properties": {"spec": {"type": "integer", "default": "three"}}},
     f"{ROOT_SCHEMA}.properties[spec].default: Invalid value: \"three\": 'three' is not of type 'integer'"),
    ({"type": "object", "properties": {"metadata": {"type": "object", "default": {"name": "x"}}}},
     f"{ROOT_SCHEMA}.properties[metadata].default: Forbidden: must not be set in top-level metadata"),
    ({"type": "object", "properties": {"spec": {"type": "array", "x-kubernetes-list-type": "map",
                                                "x-kubernetes-list-map-keys": ["name"],
                                                "items": {"type": "object", "properties": {
                                                    "name": {"type": "string"}}}}}},
     f"{ROOT_SCHEMA}.properties[spec].items.properties[name]: Required value: this property is in "
     "x-kubernetes-list-map-keys, so it must have a default or be a required property"),
    ({"type": "object", "properties": {"spec": {"type": "string", "pattern": "(?P<x"}}},
     f"{ROOT_SCHEMA}.properties[spec].pattern: Invalid value: \"(?P<x\": must be a valid regular expression, "),
], ids=["type", "items", "metadata", "properties-and-additional", "default", "metadata-default", "list-map-key",
        "pattern"])
def test_structural_schema_rules(schema, expected):
    [problem] = crd_admission.problems(_crd(schema))
    assert problem.startswith(expected), problem


SPEC = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "free": {"type": "string"},
    "pools": {"type": "array", "maxItems": 16, "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "replicas": {"type": "integer"}}}},
    "everything": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 4000}}}},
}}


@pytest.mark.parametrize("rule, expected", [
    ({"rule": "self.name != ''", "fieldPath": ".nmae"},
     'x-kubernetes-validations[0].fieldPath: Invalid value: ".nmae": must be a valid path'),
    ({"rule": "self.name != ''", "fieldPath": ".pools[0]"},
     'x-kubernetes-validations[0].fieldPath: Invalid value: ".pools[0]": must be a valid path'),
    ({"rule": "self.name != ''", "reason": "FieldValueWrong"},
     'x-kubernetes-validations[0].reason: Unsupported value: "FieldValueWrong": supported values: '),
    ({"rule": "self.nmae != ''"}, "undefined field 'nmae'"),
    ({"rule": "self.pools.all(p, p.replica > 0)"}, "undefined field 'replica'"),
    ({"rule": "self.name.isBlank()"}, "found no matching overload for 'isBlank'"),
    ({"rule": "self.free.startsWith('a')"},
     "reads spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[free], which has no maxLength"),
    ({"rule": "self.everything.all(a, self.everything.all(b, a.name.matches('^(a|b|c|d|e)+$')))"},
     "estimated rule cost exceeds budget"),
], ids=["fieldPath", "fieldPath-index", "reason", "field", "field-in-macro", "function", "unbounded", "cost"])
def test_rules_are_compiled_against_the_schema(rule, expected):
    problems = crd_admission.problems(_with_spec(SPEC, [rule]))
    assert any(expected in p for p in problems), problems


def test_a_rule_that_reads_only_declared_bounded_fields_is_accepted_and_priced():
    rule = {"rule": "self.pools.all(p, self.pools.exists_one(q, q.name == p.name))", "fieldPath": ".pools",
            "reason": "FieldValueDuplicate"}
    crd = _with_spec(SPEC, [rule])
    assert crd_admission.problems(crd) == []
    [walk] = crd_admission.schema_walk(crd)
    # Conservatively: 16 pools x 16 pools x (40 characters compared + 3 nodes) and the steps.
    assert 16 * 16 * 40 < walk.total_cost < 16 * 16 * 60


def test_old_self_is_refused_where_old_and_new_values_do_not_correlate():
    items = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 4}},
             "x-kubernetes-validations": [{"rule": "self.name == oldSelf.name"}]}
    atomic = {"type": "object", "properties": {"pools": {"type": "array", "maxItems": 4, "items": items}}}
    [problem] = crd_admission.problems(_with_spec(atomic))
    assert "oldSelf cannot be used on the uncorrelatable portion of the schema within " \
           f"{ROOT_SCHEMA}.properties[spec].properties[pools]" in problem
    keyed = copy.deepcopy(atomic)
    keyed["properties"]["pools"].update({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    keyed["properties"]["pools"]["items"]["required"] = ["name"]
    assert crd_admission.problems(_with_spec(keyed)) == []


def test_a_job_created_without_its_algorithm_cannot_have_one_added_later():
    """N11: algorithm and task default to {}, so their leaves' defaults are stored and the
    transition rules have an oldSelf to compare with."""
    crd = rljob_crd()
    edited = copy.deepcopy(MINIMAL_JOB)
    edited["spec"]["algorithm"] = {"promptsPerStep": 64}
    assert update_problems(crd, MINIMAL_JOB, edited) == [
        ("spec.algorithm.promptsPerStep", "algorithm.promptsPerStep is immutable: the job's checkpoints hold its "
                                          "value (create a new RLJob to change it)")]
    edited["spec"]["algorithm"] = {"numIterations": 99}  # not part of the job's identity
    assert update_problems(crd, MINIMAL_JOB, edited) == []
    edited["spec"] = {**MINIMAL_JOB["spec"], "task": {"name": "addition"}}
    assert [f for f, _ in update_problems(crd, MINIMAL_JOB, edited)] == ["spec.task.name"]
    # Before the defaults, the same edit passed: there was no stored algorithm to compare with.
    for section in ("algorithm", "task"):
        del crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][section][
            "default"]
    assert update_problems(crd, MINIMAL_JOB, edited) == []
