"""The RLJob CRD: generated from the spec model, structural, accepted by Kubernetes's own
schema for CRDs, and refusing bad jobs with the same verdict (and a message naming the
field) as the operator's model."""

import copy
import importlib.util
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from streamrl.operator.crd import CONDITIONS, rlcluster_crd, rljob_crd
from streamrl.operator.validate import check
from streamrl.spec import API_VERSION, GROUP, VERSION, SpecError, parse_job

ROOT = Path(__file__).resolve().parents[3]
CRD_FILE = ROOT / "helm" / "streamrl" / "files" / "crds" / f"{GROUP}_rljobs.yaml"
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("rljob-*.yaml"))
CRD = rljob_crd()


def _gen():
    spec = importlib.util.spec_from_file_location("gen_crd", ROOT / "scripts" / "gen_crd.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_crds_equal_a_fresh_generation():
    rendered = _gen().render()
    assert sorted(rendered) == sorted(p.name for p in CRD_FILE.parent.glob("*.yaml"))
    for name, text in rendered.items():
        assert (CRD_FILE.parent / name).read_text() == text, f"stale {name}: run scripts/gen_crd.py"


def test_rlcluster_crd_is_valid_and_cluster_scoped():
    crd = rlcluster_crd()
    assert kubernetes_validate.validate(crd, "1.33", strict=True) == "1.33"
    assert crd["spec"]["scope"] == "Cluster" and crd["spec"]["names"]["shortNames"] == ["rlc"]
    ok = {"spec": {"kubeconfigSecretRef": {"name": "dc-west-kubeconfig"}, "allowedNamespaces": ["rl"]}}
    assert check(crd, ok) == []
    assert check(crd, {"spec": {"kubeconfigSecretRef": {}, "allowedNamespaces": ["*"]}}) == \
        ["spec.kubeconfigSecretRef.name: Required value"]
    # Which namespaces may place pools there is said, never assumed (S2-3).
    assert check(crd, {"spec": {"kubeconfigSecretRef": {"name": "k"}}}) == ["spec.allowedNamespaces: Required value"]


def test_rlcluster_crd_is_generated_from_the_typed_spec():
    """kubectl explain shows the docstrings of operator/src/clusters.py's model."""
    spec = rlcluster_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["kubeconfigSecretRef", "allowedNamespaces"]
    assert spec["properties"]["kubeconfigSecretRef"]["properties"]["key"] == {
        "default": "kubeconfig", "description": "The key of its data holding the kubeconfig.", "maxLength": 253,
        "type": "string"}


def test_the_api_group_and_version_are_the_published_ones():
    """Every use derives from these constants; this pins what clusters and users already have."""
    assert (GROUP, VERSION, API_VERSION) == ("streamrl.io", "v1alpha1", "streamrl.io/v1alpha1")
    assert (rljob_crd()["metadata"]["name"], rlcluster_crd()["metadata"]["name"]) == \
        (f"rljobs.{GROUP}", f"rlclusters.{GROUP}")


def _walk(node: dict, path: str = "$"):
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


def test_schema_is_structural():
    schema = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    forbidden = {"$ref", "anyOf", "oneOf", "allOf", "not", "const", "title", "discriminator", "definitions", "$defs"}
    nodes = list(_walk(schema))
    assert len(nodes) > 100
    for path, node in nodes:
        assert node.get("type") or node.get("x-kubernetes-preserve-unknown-fields"), f"{path}: untyped"
        assert not forbidden & node.keys(), f"{path}: {forbidden & node.keys()}"
        assert not ("properties" in node and "additionalProperties" in node), f"{path}: both kinds of properties"
        assert node.get("additionalProperties") is not False, f"{path}: additionalProperties: false"
        if isinstance(node.get("exclusiveMinimum"), bool):
            assert "minimum" in node, path
    # Lists that CEL rules iterate are bounded (the API server's cost budget).
    assert schema["properties"]["spec"]["properties"]["generators"]["properties"]["pools"]["maxItems"] == 16


def test_crd_passes_kubernetes_schema_for_crds_in_strict_mode():
    assert kubernetes_validate.validate(CRD, "1.33", strict=True) == "1.33"


def test_crd_surface():
    spec = CRD["spec"]
    assert (spec["group"], spec["names"]["kind"], spec["names"]["shortNames"]) == (GROUP, "RLJob", ["rlj"])
    version = spec["versions"][0]
    assert version["name"] == VERSION and version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {"specReplicasPath": ".spec.generators.replicas",
                                                "statusReplicasPath": ".status.generators.replicas",
                                                "labelSelectorPath": ".status.generators.labelSelector"}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["generators"]["properties"]["labelSelector"]["type"] == "string"
    assert {"phase", "conditions", "observedGeneration", "trainer", "ranker", "generators"} <= status.keys()
    assert [c["name"] for c in version["additionalPrinterColumns"]] == \
        ["Phase", "Ready", "Generators", "Trainer-Pods", "Restarts", "Step", "Checkpoint", "Reward", "Bubble", "Age"]
    trainer = status["trainer"]["properties"]
    assert {"restarts", "preemptions", "incarnation", "resumedFrom"} <= trainer.keys()
    assert trainer["lastCheckpoint"]["properties"].keys() == {"iteration", "time"}
    assert len(CONDITIONS) == 9 and "PodsReady" in CONDITIONS
    # Pod templates stay free-form in the schema (the operator validates them).
    pool = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["generators"]["properties"][
        "pools"]["items"]
    assert pool["properties"]["placement"]["properties"]["template"]["x-kubernetes-preserve-unknown-fields"] is True
    # kubectl explain shows the model's docstrings.
    assert "node pool" in pool["properties"]["placement"]["description"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(path):
    obj = yaml.safe_load(path.read_text())
    assert check(CRD, {"spec": obj["spec"]}) == []
    parse_job(obj)


BASE = {"spec": {"model": {"source": "builtin-tiny"}, "generators": {"pools": [{"name": "l4", "replicas": 2}]}}}


def _with_all(changes: dict):
    obj = BASE
    for path, value in changes.items():
        obj = _with(path, value, obj)
    return obj


def _with(path: str, value, base=None):
    obj = copy.deepcopy(BASE if base is None else base)
    node = obj["spec"]
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return obj


INVALID = [
    (_with("algorithm.groupSize", 0), "algorithm.groupSize: 0 is less than the minimum of 1"),
    (_with("algorithm.groupSize", 1), "algorithm.groupSize: groupSize: grpo compares each sample with its group's"),
    (_with_all({"trainer.processesPerNode": 2, "trainer.memory": {"tensorParallel": 4}}),
     "trainer.memory.tensorParallel: memory.tensorParallel must divide processesPerNode"),
    (_with("pipeline.mode", "turbo"), "pipeline.mode: 'turbo' is not one of"),
    (_with("pipeline.inFlightUpdates", True),
     "pipeline.inFlightUpdates: inFlightUpdates: true needs mode stream-async"),
    (_with_all({"pipeline.mode": "batch", "pipeline.inFlightUpdates": True}),
     "pipeline.inFlightUpdates: inFlightUpdates: true needs mode stream-async"),
    (_with("algorithm.lr", 0.1), "algorithm.lr: unknown field"),
    (_with("generators.pools.0.name", "Bad_Name"), "generators.pools[0].name: 'Bad_Name' does not match"),
    (_with("generators.pools.0.replicas", -1), "generators.pools[0].replicas: -1 is less than the minimum of 0"),
    (_with("generators.pools", [{"name": "a"}, {"name": "a"}]), "generators.pools: pool names must be unique"),
    (_with("generators.pools", [{"name": "a", "replicas": 0}]),
     "generators.pools: at least one generator replica is needed"),
    (_with("generators.dispatch", {"policy": "oracle"}),
     "generators.dispatch.oracleLengths: oracleLengths is required when policy is 'oracle'"),
    (_with("model", {"source": "path"}), "model.path: path is required when source is 'path'"),
    (_with("model", {"path": "/models/x"}), "model.path: path is only used when source is 'path'"),
    (_with("task", {"name": "jsonl"}), "task.path: path, hf or pvc is required when name is 'jsonl'"),
    (_with("ranker", {"predictor": "causal-lm"}), "ranker.modelPath: modelPath is required when predictor is"),
    (_with("trainer", {"device": "cuda", "processesPerNode": 4, "placement": {"gpus": 2}}),
     "trainer.processesPerNode: processesPerNode is more than the GPUs of a trainer pod"),
    (_with("trainer", {"device": "cuda:0", "processesPerNode": 2}),
     "trainer.processesPerNode: processesPerNode is more than the GPUs of a trainer pod"),
    (_with("trainer.nodes", 0), "trainer.nodes: 0 is less than the minimum of 1"),
    (_with_all({"pipeline.mode": "colocated", "trainer.processesPerNode": 2}),
     "trainer.processesPerNode: pipeline.mode colocated runs generation and training in one process"),
    (_with("generators.pools.0.clusterRef", "dc-west"),
     "trainer.serviceType: pools in another cluster (clusterRef) need trainer.serviceType NodePort or"),
    (_with("trainer.serviceType", "LoadBalancer"),
     "security.tls: trainer.serviceType NodePort or LoadBalancer puts the trainer's gRPC port outside the cluster"),
    (_with_all({"trainer.serviceType": "NodePort", "trainer.externalHost": "gw.example"}),
     "security.tls: trainer.serviceType NodePort or LoadBalancer puts the trainer's gRPC port outside the cluster"),
    (_with("algorithm.learningRate", 0), "algorithm.learningRate: 0 is less than or equal to the minimum of 0"),
    (_with("algorithm.topP", 1.5), "algorithm.topP: 1.5 is greater than the maximum of 1"),
    (_with("generators.pools.0.placement", {"gpus": -1}),
     "generators.pools[0].placement.gpus: -1 is less than the minimum of 0"),
    (_with("generators.pools.0.placement", {"nodeSelector": {"pool": 1}}),
     "generators.pools[0].placement.nodeSelector.pool: 1 is not of type 'string'"),
    (_with("generators.replicas", 0), "generators.replicas: 0 is less than the minimum of 1"),
    (_with("trainer.serviceType", "Ingress"), "trainer.serviceType: 'Ingress' is not one of"),
    (_with("security.tls", {"caFile": 5}), "security.tls.caFile: 5 is not of type 'string'"),
    (_with("security.tls", {"serverName": ""}), "security.tls.serverName: '' should be non-empty"),
    (_with("security.tls", {"generatorSecretName": "gen-tls"}),
     "security.tls.generatorServerName: generatorSecretName needs generatorServerName"),
    (_with("security.tls", {"generatorServerName": "streamrl"}),
     "security.tls.generatorServerName: generatorServerName must differ from serverName"),
    (_with("generators.pools", [{"name": f"p{i}"} for i in range(17)]),
     "generators.pools: must have at most 16 items, has 17"),
    (_with("generators.dispatch", {"longTailFraction": 1.5}),
     "generators.dispatch.longTailFraction: 1.5 is greater than the maximum of 1"),
    (_with("generators.pools.0.engine", {"type": "tpu"}), "generators.pools[0].engine.type: 'tpu' is not one of"),
    (_with("generators.pools.0.engine", {"type": "torch", "maxNumSeqs": 8}),
     "generators.pools[0].engine.maxNumSeqs: maxNumSeqs applies to type vllm only"),
    (_with("generators.pools.0.engine", {"type": "vllm", "maxBatchSize": 8}),
     "generators.pools[0].engine.maxBatchSize: maxBatchSize applies to type torch only"),
    (_with("generators.pools.0.engine", {"type": "vllm", "gpuMemoryUtilization": 1.5}),
     "generators.pools[0].engine.gpuMemoryUtilization: 1.5 is greater than the maximum of 1"),
    (_with("trainer.weightChunkBytes", 100), "trainer.weightChunkBytes: 100 is less than the minimum of 1024"),
    (_with("suspend", "yes"), "suspend: 'yes' is not of type 'boolean'"),
    (_with("generators.pools", [{"name": "a", "replicas": 1, "minReplicas": 3, "maxReplicas": 2}]),
     "generators.pools[0].maxReplicas: maxReplicas must be at least minReplicas"),
    (_with("autoscaling", {"mode": "Sometimes"}), "autoscaling.mode: 'Sometimes' is not one of"),
    (_with("autoscaling", {"behavior": {"scaleDown": {"policies": []}}}),
     "autoscaling.behavior.scaleDown.policies: [] should be non-empty"),
]


@pytest.mark.parametrize("obj, message", INVALID, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(INVALID)])
def test_invalid_jobs_are_refused_with_the_field_named(obj, message):
    errors = check(CRD, obj)
    assert any(("spec." + message) in e for e in errors), errors
    with pytest.raises(SpecError):  # the operator's model agrees
        parse_job(obj)


def test_valid_base_is_accepted():
    assert check(CRD, BASE) == []


def test_a_vllm_engine_is_accepted_with_its_own_fields_and_engine_args():
    engine = {"type": "vllm", "device": "cpu", "maxNumSeqs": 16, "enforceEager": True, "cpuKvCacheGib": 0.5,
              "engineArgs": {"max_num_batched_tokens": 4096}}
    obj = _with("generators.pools.0.engine", engine)
    assert check(CRD, obj) == []
    assert parse_job(obj).spec.generators.pools[0].engine.max_batch_size == 16
    assert len(INVALID) >= 20


@pytest.mark.parametrize("name, ok", [
    ("tiny", True), ("a" * 49, True), ("a" * 50, False), ("7b-grpo", False), ("llama.sft", False),
    ("Upper", False), ("ends-", False), ("grpo-7b", True),
])
def test_the_name_must_make_every_child_a_valid_object(name, ok):
    """The longest child, <name>-trainer-ranks, is a Service: a DNS-1035 label of at most 63 characters.
    The CRD refuses (CEL on metadata.name) what the operator's model refuses."""
    obj = {"metadata": {"name": name}, **BASE}
    problems = check(CRD, obj)
    assert (problems == []) == ok, problems
    if not ok:
        assert problems == ["metadata.name: metadata.name must be a DNS-1035 label of at most 49 characters (lower-"
                            "case letters, digits and '-', starting with a letter, ending with a letter or digit): "
                            "the operator names the job's Services <name>-trainer-ranks, which Kubernetes allows up "
                            "to 63 characters"]
        with pytest.raises(SpecError, match="metadata.name: .* must be a DNS-1035 label of at most 49"):
            parse_job(obj)
    else:
        assert parse_job(obj).metadata.name == name


def test_what_a_checkpoint_must_match_cannot_change_on_a_running_job():
    """CEL transition rules: the API server refuses the change (a rolled trainer would refuse its own
    checkpoint and spend the restart budget); offline validation, which has no stored object, skips them."""
    spec = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for section, field in [("algorithm", "groupSize"), ("algorithm", "promptsPerStep"), ("algorithm", "seed"),
                           ("task", "name"), ("task", "seed"), ("task", "numPrompts"), ("task", "curriculum")]:
        [rule] = spec[section]["properties"][field]["x-kubernetes-validations"]
        assert rule["rule"] == "self == oldSelf" and f"{section}.{field} is immutable" in rule["message"]
    assert "x-kubernetes-validations" not in spec["algorithm"]["properties"]["learningRate"]
