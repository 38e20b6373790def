"""`streamrl validate`: an RLJob checked offline as the cluster would, with every problem's field.

The API server's part (the CRD's OpenAPI schema, unknown fields refused as with strict field
validation, schema defaults, then every `x-kubernetes-validations` CEL rule, via cel-python),
then the operator's (the spec model). Knows no cluster and imports neither kopf nor torch.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, cast

import celpy
import jsonschema
import yaml
from celpy.adapter import json_to_cel

from streamrl.operator.crd import rljob_crd
from streamrl.spec import GROUP, KIND, RLJob, SpecError, dump_job, field_path, parse_job
from streamrl.vllm_args import job_problems


def to_jsonschema(node: dict) -> dict:
    """OpenAPI v3 (structural) -> JSON Schema draft 7, closed where the CRD is closed."""
    out = {k: v for k, v in node.items() if not k.startswith("x-kubernetes") and k not in ("nullable", "default")}
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
    if node.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("exclusiveMaximum") is True:
        out["exclusiveMaximum"] = out.pop("maximum")
    if "properties" in node:
        out["properties"] = {k: to_jsonschema(v) for k, v in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = to_jsonschema(node["additionalProperties"])
    if "items" in node:
        out["items"] = to_jsonschema(node["items"])
    return out


def apply_defaults(node: dict, value) -> Any:
    """`value` with the schema's defaults filled in, as the API server stores it."""
    if isinstance(value, dict) and "properties" in node:
        for key, sub in node["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
    elif isinstance(value, list) and "items" in node:
        return [apply_defaults(node["items"], v) for v in value]
    return value


def _schema_problems(error: jsonschema.ValidationError) -> list[tuple[str, str]]:
    """One jsonschema error as the API server words it (a missing or unknown field named itself)."""
    where = tuple(error.absolute_path)
    # Set on every error a validator yields (jsonschema's stubs allow them to be Unset).
    value, instance, schema = cast(Any, error.validator_value), cast(Any, error.instance), cast(Any, error.schema)
    if error.validator == "required":
        named = [p for p in value if p not in instance and error.message.startswith(repr(p))]
        return [(field_path((*where, p)), "Required value") for p in named[:1]] or [(field_path(where), error.message)]
    if error.validator == "additionalProperties":
        known = schema.get("properties", {})
        return [(field_path((*where, key)), "unknown field") for key in instance if key not in known]
    # jsonschema quotes the whole value; for "too long" that is the long thing itself.
    if error.validator == "maxItems":
        return [(field_path(where), f"must have at most {value} items, has {len(instance)}")]
    if error.validator == "maxLength":
        return [(field_path(where), f"must be at most {value} characters, has {len(instance)}")]
    return [(field_path(where), error.message)]


def _broken(rule: dict, env: celpy.Environment, path: str, **bindings) -> list[tuple[str, str]]:
    """[(field, message)] when the rule is false for these bindings (self, oldSelf), else []."""
    program = env.program(env.compile(rule["rule"]))
    if bool(program.evaluate({k: json_to_cel(v) for k, v in bindings.items()})):
        return []
    return [((path + rule.get("fieldPath", "")).lstrip("."), rule["message"])]


def _cel_problems(node: dict, value, path: str, env: celpy.Environment) -> list[tuple[str, str]]:
    problems = []
    for rule in node.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            continue  # a transition rule: judged against the stored object, on an update only
        problems += _broken(rule, env, path, self=value)
    if isinstance(value, dict) and "properties" in node:
        for key, sub in node["properties"].items():
            if key in value and value[key] is not None:
                problems += _cel_problems(sub, value[key], f"{path}.{key}", env)
    elif isinstance(value, list) and "items" in node:
        for i, v in enumerate(value):
            problems += _cel_problems(node["items"], v, f"{path}[{i}]", env)
    return problems


def api_server_problems(crd: dict, obj: dict) -> list[tuple[str, str]]:
    """(field, message) of every reason the API server would refuse `obj`; [] = accepted."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    closed = to_jsonschema(schema)
    closed["properties"]["metadata"].pop("additionalProperties", None)  # ObjectMeta: only its name is declared
    problems = [p for e in jsonschema.Draft7Validator(closed).iter_errors(obj) for p in _schema_problems(e)]
    if problems:
        return problems  # like the API server: CEL runs on schema-valid objects only
    obj = apply_defaults(schema, copy.deepcopy(obj))
    return _cel_problems(schema, obj, "", celpy.Environment())


def _transition_problems(node: dict, old, new, path: str, env: celpy.Environment) -> list[tuple[str, str]]:
    problems = []
    for rule in node.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            problems += _broken(rule, env, path, self=new, oldSelf=old)
    if isinstance(old, dict) and isinstance(new, dict) and "properties" in node:
        for key, sub in node["properties"].items():
            if old.get(key) is not None and new.get(key) is not None:
                problems += _transition_problems(sub, old[key], new[key], f"{path}.{key}", env)
    return problems  # list items are not correlated (no list of ours is a list-type map)


def update_problems(crd: dict, old: dict, new: dict) -> list[tuple[str, str]]:
    """(field, message) of every reason the API server would refuse to update the stored `old`
    to `new`: `new`'s own problems, then the transition rules (`oldSelf`), each judged only where
    the stored object, defaults applied, has the field too."""
    problems = api_server_problems(crd, new)
    if problems:
        return problems
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    old, new = (apply_defaults(schema, copy.deepcopy(o)) for o in (old, new))
    return _transition_problems(schema, old, new, "", celpy.Environment())


def check(crd: dict, obj: dict) -> list[str]:
    """Every reason the API server would refuse `obj` ("field: message"); [] = accepted."""
    return [f"{where}: {message}" for where, message in api_server_problems(crd, obj)]


def _covers(field: str, other: str) -> bool:
    """`field` names `other` or a part of it (pools[0] covers pools[0].name)."""
    return other == field or other.startswith((field + ".", field + "["))


@dataclass(frozen=True)
class Verdict:
    """What the cluster would say about one RLJob document."""

    source: str
    """The file, and the document's number when the file holds several."""
    problems: tuple[tuple[str, str], ...]
    """(field, message) of each problem (field "" for the file as a whole); empty = valid."""
    job: RLJob | None
    """The job with every default resolved, when valid."""
    skipped: str | None = None
    """Why the document was not checked (another kind of object)."""


def validate_job(data, source: str, crd: dict | None = None) -> Verdict:
    """The API server's problems merged with the operator's model's: the model's words where both
    name the same field, the more precise field where one names a part of the other."""
    if not isinstance(data, dict):
        return Verdict(source, (("<root>", f"an RLJob must be a mapping, got {type(data).__name__}"),), None)
    problems = api_server_problems(crd or rljob_crd(), data)
    try:
        job = parse_job(data, source)
    except SpecError as err:
        job = None
        for where, message in err.problems:
            same = [i for i, (field, _) in enumerate(problems) if field == where]
            if same:
                problems[same[0]] = (where, message)
            elif where == "spec" or not any(_covers(where, f) or _covers(f, where) for f, _ in problems):
                problems.append((where, message))
    if job is not None and not problems:
        problems += job_problems(job)  # engine.type vllm: installed here, its engineArgs known to it
    return Verdict(source, tuple(problems), None if problems else job)


def _is_rljob(doc) -> bool:
    """Whether a YAML document is meant as an RLJob (others, e.g. a KEDA ScaledObject, are skipped)."""
    if not isinstance(doc, dict):
        return True
    api_version, kind = str(doc.get("apiVersion", "")), doc.get("kind")
    return kind is None or kind == KIND or api_version.startswith(GROUP + "/")


def validate_file(path: Path, crd: dict | None = None) -> list[Verdict]:
    """A verdict on every document of the file, in order (documents of other kinds skipped)."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except OSError as err:
        return [Verdict(str(path), (("", f"cannot read: {err.strerror}"),), None)]
    except yaml.YAMLError as err:
        return [Verdict(str(path), (("", f"not valid YAML: {err}"),), None)]
    if not docs:
        return [Verdict(str(path), (("", "empty: no RLJob in it"),), None)]
    crd = crd or rljob_crd()
    verdicts = []
    for i, doc in enumerate(docs, 1):
        source = f"{path} (document {i})" if len(docs) > 1 else str(path)
        if _is_rljob(doc):
            verdicts.append(validate_job(doc, source, crd))
        else:
            verdicts.append(Verdict(source, (), None, f"not an RLJob ({doc.get('apiVersion')} {doc.get('kind')})"))
    return verdicts


def run(paths: list[str], show_defaults: bool, out: TextIO) -> int:
    """Print every problem as `FILE: field: message` (or each job resolved); 1 when any has a problem."""
    crd = rljob_crd()
    failed = False
    for name in paths:
        for v in validate_file(Path(name), crd):
            failed |= bool(v.problems)
            for where, message in v.problems:
                print(f"{v.source}: {where + ': ' if where else ''}{message}", file=out)
            if v.skipped:
                print(f"{'# ' if show_defaults else ''}{v.source}: skipped: {v.skipped}", file=out)
            elif v.job and show_defaults:
                print(f"---\n# {v.source}: valid RLJob {v.job.metadata.name}, every default resolved", file=out)
                print(dump_job(v.job), end="", file=out)
            elif v.job:
                print(f"{v.source}: valid RLJob {v.job.metadata.name}", file=out)
    return 1 if failed else 0
