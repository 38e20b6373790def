"""The RLJob and RLCluster CustomResourceDefinitions, generated from their typed models
(streamrl/spec/, operator/src/clusters.py).

pydantic's JSON schema becomes a *structural* OpenAPI v3 schema: references inlined,
`X | None` as nullable, exclusive bounds in OpenAPI 3.0 form, free-form objects kept
(`x-kubernetes-preserve-unknown-fields`), no titles. Cross-field checks that pydantic does
in validators are repeated as CEL rules (`x-kubernetes-validations`) so `kubectl apply`
refuses a bad job before the operator sees it. `scripts/gen_crd.py` writes the result; a
test fails when the committed file is stale.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from streamrl.checkpoints import IDENTITY_FIELDS
from streamrl.operator.clusters import ClusterPhase, RLClusterSpec
from streamrl.operator.phases import JobPhase
from streamrl.spec import GROUP, KIND, VERSION, RLJobSpec
from streamrl.spec.job import NAME_MAX, NAME_PATTERN, NAME_RULE

PLURAL, SHORT = "rljobs", "rlj"
CONDITIONS = ("Ready", "Progressing", "Suspended", "Complete", "Failed", "PodsReady", "ScalingLimited",
              "ClustersReady", "Queued")
NAME_CEL = {"rule": f"!has(self.metadata) || !has(self.metadata.name) || "
                    f"(self.metadata.name.matches('{NAME_PATTERN}') && size(self.metadata.name) <= {NAME_MAX})",
            "message": f"metadata.name {NAME_RULE}", "fieldPath": ".metadata.name"}
"""On the RLJob itself: a name every child's name can be made from (the spec model says the same)."""
METADATA = {"type": "object", "properties": {"name": {"type": "string"}}}
"""The root's metadata as a CRD may declare it: ObjectMeta is implicit, and only `name` and
`generateName` may be declared (the API server refuses anything else). `name` is declared so
that a rule's `fieldPath: .metadata.name` resolves: the API server resolves every fieldPath
through the declared properties when the CRD is created, and refuses the CRD otherwise."""
IMMUTABLE = tuple(f"{section}.{key}" for section, keys in IDENTITY_FIELDS.items() for key in keys)
"""What a checkpoint must match to be resumed (the JobIdentity's spec fields, streamrl/checkpoints.py):
changing it on a running job would make the rolled trainer refuse its own checkpoint and
spend the restart budget, so the API server refuses the change (CEL transition rules)."""

# Cross-field rules, by the spec path of the object they sit on (mirroring the spec models' validators).
CEL_RULES: dict[str, list[dict[str, str]]] = {
    "": [
        {"rule": "!has(self.generators) || !has(self.generators.pools) || "
                 "!self.generators.pools.exists(p, has(p.clusterRef)) || "
                 "(has(self.trainer) && self.trainer.serviceType != 'ClusterIP')",
         "message": "pools in another cluster (clusterRef) need trainer.serviceType NodePort or LoadBalancer",
         "fieldPath": ".trainer.serviceType"},
        {"rule": "!has(self.trainer) || !has(self.trainer.serviceType) || self.trainer.serviceType == 'ClusterIP' || "
                 "(has(self.security) && has(self.security.tls))",
         "message": "trainer.serviceType NodePort or LoadBalancer puts the trainer's gRPC port outside the cluster: "
                    "security.tls is required", "fieldPath": ".security.tls", "reason": "FieldValueRequired"},
        {"rule": "!has(self.pipeline) || !has(self.pipeline.mode) || self.pipeline.mode != 'colocated' || "
                 "!has(self.trainer) || ((has(self.trainer.nodes) ? self.trainer.nodes : 1) == 1 && "
                 "(has(self.trainer.processesPerNode) ? self.trainer.processesPerNode : 1) == 1)",
         "message": "pipeline.mode colocated runs generation and training in one process: trainer.nodes and "
                    "trainer.processesPerNode must be 1", "fieldPath": ".trainer.processesPerNode"},
    ],
    "model": [rule for name in ("path", "hf", "pvc", "image") for rule in (
        {"rule": f"self.source != '{name}' || has(self.{name})", "message": f"{name} is required when source is "
         f"'{name}'", "fieldPath": f".{name}", "reason": "FieldValueRequired"},
        {"rule": f"self.source == '{name}' || !has(self.{name})", "message": f"{name} is only used when source is "
         f"'{name}'", "fieldPath": f".{name}", "reason": "FieldValueForbidden"},
    )],
    "task": [
        {"rule": "self.name != 'jsonl' || has(self.path) || has(self.hf) || has(self.pvc)",
         "message": "path, hf or pvc is required when name is 'jsonl'", "fieldPath": ".path",
         "reason": "FieldValueRequired"},
        {"rule": "(has(self.path) ? 1 : 0) + (has(self.hf) ? 1 : 0) + (has(self.pvc) ? 1 : 0) <= 1",
         "message": "a task's file comes from one of path, hf and pvc", "fieldPath": ".path"},
        {"rule": "self.name == 'jsonl' || (!has(self.hf) && !has(self.pvc))",
         "message": "hf and pvc are only used when name is 'jsonl'", "fieldPath": ".name"},
    ],
    "generators": [
        {"rule": "!has(self.pools) || self.pools.all(p, self.pools.exists_one(q, q.name == p.name))",
         "message": "pool names must be unique", "fieldPath": ".pools", "reason": "FieldValueDuplicate"},
        {"rule": "!has(self.pools) || self.pools.exists(p, p.replicas > 0)",
         "message": "at least one generator replica is needed", "fieldPath": ".pools"},
    ],
    "pipeline": [
        {"rule": "!has(self.inFlightUpdates) || !self.inFlightUpdates || "
                 "(has(self.mode) && self.mode == 'stream-async')",
         "message": "inFlightUpdates: true needs mode stream-async: only there do generators run requests while a "
                    "new version arrives", "fieldPath": ".inFlightUpdates"},
    ],
    "generators.pools[]": [
        {"rule": "!has(self.maxReplicas) || self.maxReplicas >= self.minReplicas",
         "message": "maxReplicas must be at least minReplicas", "fieldPath": ".maxReplicas"},
    ],
    "generators.dispatch": [
        {"rule": "self.policy != 'oracle' || has(self.oracleLengths)",
         "message": "oracleLengths is required when policy is 'oracle'", "fieldPath": ".oracleLengths",
         "reason": "FieldValueRequired"},
    ],
    "algorithm": [
        {"rule": "(has(self.type) && self.type == 'ppo') || !has(self.groupSize) || self.groupSize >= 2",
         "message": "groupSize: grpo compares each sample with its group's: 2 or more (type ppo allows 1)",
         "fieldPath": ".groupSize"},
    ],
    "trainer": [
        {"rule": "!has(self.memory) || !has(self.memory.tensorParallel) || "
                 "(has(self.processesPerNode) ? self.processesPerNode : 1) % self.memory.tensorParallel == 0",
         "message": "memory.tensorParallel must divide processesPerNode: a layer is split across the ranks of one "
                    "node", "fieldPath": ".memory.tensorParallel"},
        {"rule": "!has(self.device) || !self.device.startsWith('cuda') || "
                 "(has(self.processesPerNode) ? self.processesPerNode : 1) <= "
                 "(has(self.placement) && has(self.placement.gpus) ? self.placement.gpus : 0)",
         "message": "processesPerNode is more than the GPUs of a trainer pod (placement.gpus): on a CUDA trainer "
                    "each rank needs a GPU", "fieldPath": ".processesPerNode"},
    ],
    "security.tls": [
        {"rule": "!has(self.generatorSecretName) || has(self.generatorServerName)",
         "message": "generatorSecretName needs generatorServerName: the name its certificate carries, which peers "
                    "verify", "fieldPath": ".generatorServerName", "reason": "FieldValueRequired"},
        {"rule": "!has(self.generatorServerName) || !has(self.serverName) || "
                 "self.generatorServerName != self.serverName",
         "message": "generatorServerName must differ from serverName: a generator's certificate would pass for the "
                    "trainer's", "fieldPath": ".generatorServerName"},
    ],
    "ranker": [
        {"rule": "self.predictor != 'causal-lm' || has(self.modelPath)",
         "message": "modelPath is required when predictor is 'causal-lm'", "fieldPath": ".modelPath",
         "reason": "FieldValueRequired"},
    ],
}


def _description(text: str) -> str:
    return " ".join(text.split())


def structural(node: dict, defs: dict) -> dict:
    """One pydantic JSON-schema node as a structural OpenAPI v3 node."""
    def wrapped(inner: dict, **extra) -> dict:
        """A reference or one-member union resolved, keeping this node's description."""
        out = structural(inner, defs)
        if "description" in node:
            out["description"] = _description(node["description"])
        if "default" in node and node["default"] is not None and not isinstance(node["default"], (dict, list)):
            out["default"] = node["default"]  # an enum field's default sits beside its reference
        return {**out, **extra}

    if "$ref" in node:
        return wrapped(defs[node["$ref"].rsplit("/", 1)[-1]])
    if "oneOf" in node:  # a discriminated union (the engine): one object, each member's fields its own
        if len(node["oneOf"]) == 1:
            return wrapped(node["oneOf"][0])
        merged = tagged_union(node, defs)  # structural already
        return {**merged, "description": _description(node["description"])} if "description" in node else merged
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1 or len(node["anyOf"]) != 2:
            raise ValueError(f"only `X | None` unions are supported, got {node['anyOf']}")
        extra = {"default": node["default"]} if node.get("default") is not None else {}
        return wrapped(options[0], nullable=True, **extra)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "additionalProperties", "properties", "items", "$defs"):
            continue
        if key == "default":
            if value is None or isinstance(value, (dict, list)):
                continue  # null and object defaults stay the operator's (pydantic applies them)
            out[key] = value
        elif key == "description":
            out[key] = _description(value)
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    if "enum" in node and "type" not in out:
        out["type"] = "string"
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {k: structural(v, defs) for k, v in node["properties"].items()}
        if node.get("required"):
            out["required"] = node["required"]
    elif out.get("type") == "object":
        extra = node.get("additionalProperties", True)
        if isinstance(extra, dict) and extra.get("type") in ("string", "integer", "number", "boolean"):
            out["additionalProperties"] = {"type": extra["type"]}
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    if "items" in node:
        out["items"] = structural(node["items"], defs)
    if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        raise ValueError(f"untyped schema node: {node}")
    return out


def tagged_union(node: dict, defs: dict) -> dict:
    """A pydantic discriminated union (`oneOf` with a `discriminator`) as one structural object,
    since a structural schema cannot put properties under `oneOf`: the tag's enum lists every
    member, a field that several members declare alike is shared, and any other field carries no
    default (the API server would store it under every tag; pydantic applies each member's own)
    and a CEL rule that refuses it under the other tags."""
    tag = node["discriminator"]["propertyName"]
    members = [defs[ref["$ref"].rsplit("/", 1)[-1]] for ref in node["oneOf"]]
    names = [m["properties"][tag]["const"] for m in members]
    schemas = [structural(m, defs) for m in members]
    props: dict[str, list[dict]] = {}
    owners: dict[str, list[str]] = {}
    for name, schema in zip(names, schemas):
        for key, sub in schema["properties"].items():
            owners.setdefault(key, []).append(name)
            props.setdefault(key, []).append(sub)
    out: dict[str, Any] = {"type": "object", "properties": {}}
    rules = []
    for key, subs in props.items():
        if key == tag:
            out["properties"][key] = {**subs[0], "enum": names}
            continue
        if len(owners[key]) == len(names) and all(sub == subs[0] for sub in subs):
            out["properties"][key] = subs[0]
            continue
        first = {k: v for k, v in subs[0].items() if k != "default"}
        first["description"] = " ".join(f"({owner}) {sub.get('description', '')}".strip()
                                        for owner, sub in zip(owners[key], subs))
        out["properties"][key] = first
        if len(owners[key]) < len(names):
            allowed = ", ".join(f"'{o}'" for o in owners[key])
            rules.append({"rule": f"!has(self.{key}) || self.{tag} in [{allowed}]",
                          "message": f"{key} applies to {tag} {' or '.join(owners[key])} only",
                          "fieldPath": f".{key}"})
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


def _at(schema: dict, path: str) -> dict:
    """The schema node at a spec path ("a.b"; "a[]" = the items of list a)."""
    for part in [p for p in path.split(".") if p]:
        schema = schema["properties"][part.removesuffix("[]")]
        if part.endswith("[]"):
            schema = schema["items"]
    return schema


def model_schema(model: type[BaseModel]) -> dict:
    """A pydantic model's JSON schema as a structural OpenAPI v3 schema."""
    raw = model.model_json_schema(by_alias=True)
    return structural(raw, raw.get("$defs", {}))


def spec_schema() -> dict:
    schema = model_schema(RLJobSpec)
    for path, rules in CEL_RULES.items():
        _at(schema, path)["x-kubernetes-validations"] = rules
    for path in IMMUTABLE:
        _at(schema, path)["x-kubernetes-validations"] = [{
            "rule": "self == oldSelf",
            "message": f"{path} is immutable: the job's checkpoints hold its value (create a new RLJob to change it)"}]
    for section in sorted({path.split(".")[0] for path in IMMUTABLE}):
        # The API server runs a transition rule only where the stored object has the field. An
        # omitted section with no default of its own would never materialise its leaves' defaults,
        # so a later edit adding one would pass: defaulted to {}, its leaves are stored too.
        _at(schema, section)["default"] = {}
    return schema


def _obj(description: str, properties: dict, **extra) -> dict:
    return {"type": "object", "description": description, "properties": properties, **extra}


def status_schema() -> dict:
    integer, number = {"type": "integer", "format": "int64"}, {"type": "number"}
    condition = _obj("A condition of the job (Kubernetes conventions).", {
        "type": {"type": "string", "description": "One of " + ", ".join(CONDITIONS) + "."},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string", "description": "CamelCase reason for the last transition."},
        "message": {"type": "string", "description": "Human-readable details."},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "observedGeneration": integer,
    }, required=["type", "status"])
    pool = _obj("One generator pool.", {
        "name": {"type": "string"}, "cluster": {"type": "string", "description": "RLCluster, empty = local."},
        "replicas": integer, "readyReplicas": integer,
    })
    return _obj("Written by the operator.", {
        "phase": {"type": "string", "enum": [p.value for p in JobPhase],
                  "description": "Where the job is in its life."},
        "message": {"type": "string", "description": "Why it is in this phase (for Invalid: the field and problem)."},
        "observedGeneration": {**integer, "description": "The spec generation this status describes."},
        "startTime": {"type": "string", "format": "date-time"},
        "completionTime": {"type": "string", "format": "date-time"},
        "conditions": {"type": "array", "items": condition, "x-kubernetes-list-type": "map",
                       "x-kubernetes-list-map-keys": ["type"]},
        "generators": _obj("All generator pools.", {
            "replicas": {**integer, "description": "Replicas asked for, over all pools."},
            "readyReplicas": integer,
            "labelSelector": {"type": "string", "description": "Selector of every generator pod (for /scale)."},
            "pools": {"type": "array", "items": pool},
        }),
        "trainer": _obj("The trainer group (its pods, as the operator sees them) and its progress, as rank 0 "
                        "reports it.", {
            "ready": {"type": "boolean"},
            "readyPods": {**integer, "description": "Trainer pods ready (one per trainer node)."},
            "expectedPods": {**integer, "description": "Trainer pods the spec asks for: trainer.nodes (0 while "
                                                       "suspended)."},
            "restarts": {**integer, "description": "Times the whole trainer group was restarted after a pod "
                                                   "failed, counted against spec.trainer.restartLimit (a new spec "
                                                   "starts again from 0)."},
            "preemptions": {**integer, "description": "Times the group was restarted after it was stopped from "
                                                      "outside (exit code 75 after saving on SIGTERM, an eviction or "
                                                      "node drain, a suspension): not counted against the budget."},
            "iteration": integer, "policyVersion": integer, "reward": number,
            "pipelineBubbleRatio": number, "samplesPerSecond": number,
            "incarnation": {**integer, "description": "The trainer's starts in this run, minus one."},
            "resumedFrom": {**integer, "nullable": True,
                            "description": "The iteration the trainer's current start resumed at (unset: fresh)."},
            "lastCheckpoint": _obj("The newest checkpoint written whole.", {
                "iteration": {**integer, "description": "Iterations trained before it (a resume continues there)."},
                "time": {"type": "string", "format": "date-time"},
            }, nullable=True),
        }),
        "ranker": _obj("The output-length ranker.", {"ready": {"type": "boolean"}, "recall": number}),
        "autoscaling": _obj("The autoscaler: its mode, what its last round saw and decided, and why.", {
            "mode": {"type": "string", "enum": ["Internal", "External"],
                     "description": "Internal: the operator scales the pools; External: whoever writes /scale does."},
            "message": {"type": "string", "description": "What the last round did, or why it waited."},
            "prometheusUrl": {"type": "string", "description": "The Prometheus HTTP API read."},
            "desiredReplicas": {"type": "object", "additionalProperties": integer,
                                "description": "Replicas per pool the last decision asked for."},
            "lastDecision": _obj("The last decision (a round that waited makes none).", {
                "time": {"type": "string", "format": "date-time"},
                "step": {**integer, "description": "+1 (a replica added), 0 or -1 (one removed)."},
                "pool": {"type": "string", "description": "The pool that changed (empty: none)."},
                "reason": {"type": "string"},
            }),
            "lastScaleTime": {"type": "string", "format": "date-time",
                              "description": "When replicas last changed (the inputs are read since then)."},
            "trainerBound": {"type": "boolean",
                             "description": "Training is the bottleneck and every pool is at its minReplicas."},
            "limited": _obj("Why more generators cannot help (the ScalingLimited condition).", {
                "reason": {"type": "string", "enum": ["TrainerBound", "AtMaxReplicas"]},
                "message": {"type": "string"},
            }),
            "inputs": _obj("What the last round read from Prometheus.", {
                "windowSeconds": {**number, "description": "Seconds of history read (since the last change)."},
                "generationSeconds": {**number, "description": "Generation time per iteration, mean."},
                "trainSeconds": {**number, "description": "Training time per iteration, mean."},
                "idleNoWork": {**number, "description": "Fraction of generator time idle for lack of work."},
                "connected": {"type": "object", "additionalProperties": integer,
                              "description": "Replicas connected to the trainer, by pool."},
                "samplesPerSecond": {"type": "object", "additionalProperties": number,
                                     "description": "Samples/s of one replica, by pool."},
            }),
        }),
    })


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Generators", "type": "integer", "jsonPath": ".status.generators.readyReplicas",
     "description": "Ready generator replicas over all pools"},
    {"name": "Trainer-Pods", "type": "integer", "jsonPath": ".status.trainer.readyPods",
     "description": "Ready trainer pods (out of status.trainer.expectedPods)", "priority": 1},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.trainer.restarts",
     "description": "Whole-group restarts of the trainer", "priority": 1},
    {"name": "Step", "type": "integer", "jsonPath": ".status.trainer.iteration"},
    {"name": "Checkpoint", "type": "integer", "jsonPath": ".status.trainer.lastCheckpoint.iteration",
     "description": "Iteration of the newest checkpoint", "priority": 1},
    {"name": "Reward", "type": "number", "jsonPath": ".status.trainer.reward"},
    {"name": "Bubble", "type": "number", "jsonPath": ".status.trainer.pipelineBubbleRatio",
     "description": "Pipeline-bubble ratio of the last iteration"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _crd(kind: str, plural: str, short: str, scope: str, description: str, spec: dict, status: dict,
         subresources: dict, columns: list[dict], rules: list[dict] | None = None) -> dict:
    """A one-version CustomResourceDefinition of StreamRL's API group."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/name": "streamrl"}},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower(),
                      "shortNames": [short], "categories": ["streamrl"]},
            "scope": scope,
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": description,
                    "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": METADATA, "spec": spec, "status": status},
                    "required": ["spec"],
                    **({"x-kubernetes-validations": rules} if rules else {}),
                }},
                "subresources": subresources,
                "additionalPrinterColumns": columns,
            }],
        },
    }


def rljob_crd() -> dict:
    return _crd(
        KIND, PLURAL, SHORT, "Namespaced",
        "An RL post-training job: generator pools, a trainer and a ranker, streaming samples and weights over gRPC.",
        {**spec_schema(), "description": "The job (the same spec `streamrl run` takes)."},
        status_schema(),
        {"status": {}, "scale": {"specReplicasPath": ".spec.generators.replicas",
                                 "statusReplicasPath": ".status.generators.replicas",
                                 "labelSelectorPath": ".status.generators.labelSelector"}},
        PRINTER_COLUMNS,
        [NAME_CEL],
    )


def rlcluster_crd() -> dict:
    """RLCluster: another Kubernetes cluster (e.g. another datacenter) generator pools can run in."""
    return _crd(
        "RLCluster", "rlclusters", "rlc", "Cluster",
        "A Kubernetes cluster RLJob generator pools can run in (spec.generators.pools[].clusterRef names it).",
        model_schema(RLClusterSpec),
        _obj("Written by the operator.", {
            "phase": {"type": "string", "enum": [p.value for p in ClusterPhase]},
            "message": {"type": "string"},
            "conditions": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }),
        {"status": {}},
        [{"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
         {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
         {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
    )
