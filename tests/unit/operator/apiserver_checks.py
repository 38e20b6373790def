"""What the Kubernetes API server checks when an RLJob is applied, done without one: the
CRD's OpenAPI schema (as JSON Schema, unknown fields refused as with strict field
validation), schema defaults, then every `x-kubernetes-validations` CEL rule (cel-python)."""

from __future__ import annotations

import copy

import celpy
import jsonschema
from celpy.adapter import json_to_cel


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


def apply_defaults(node: dict, value):
    if isinstance(value, dict) and "properties" in node:
        for key, sub in node["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
    elif isinstance(value, list) and "items" in node:
        return [apply_defaults(node["items"], v) for v in value]
    return value


def _cel_errors(node: dict, value, path: str, env: celpy.Environment) -> list[str]:
    errors = []
    for rule in node.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"]))
        if not bool(program.evaluate({"self": json_to_cel(value)})):
            errors.append(f"{path}{rule.get('fieldPath', '')}: {rule['message']}")
    if isinstance(value, dict) and "properties" in node:
        for key, sub in node["properties"].items():
            if key in value and value[key] is not None:
                errors += _cel_errors(sub, value[key], f"{path}.{key}", env)
    elif isinstance(value, list) and "items" in node:
        for i, v in enumerate(value):
            errors += _cel_errors(node["items"], v, f"{path}[{i}]", env)
    return errors


def check(crd: dict, obj: dict) -> list[str]:
    """Every reason the API server would refuse `obj` ("path: message"); [] = accepted."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(to_jsonschema(schema)).iter_errors(obj)]
    if errors:
        return errors  # like the API server: CEL runs on schema-valid objects only
    obj = apply_defaults(schema, copy.deepcopy(obj))
    return _cel_errors(schema, obj, "", celpy.Environment())
