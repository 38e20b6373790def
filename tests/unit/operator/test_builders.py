"""The builders: every object passes Kubernetes's own schemas in strict mode, pools land
on the node pools and GPUs they name, user templates merge under the operator's part."""

from pathlib import Path

import kubernetes_validate
import pytest

from streamrl.operator.builders import (
    PREEMPTED_EXIT_CODE,
    TRAINER_GRACE_S,
    build_children,
    build_generators,
    template_hash,
)
from streamrl.operator.names import MAIN, TEMPLATE_HASH, generator_selector, owner_reference
from streamrl.operator.pods import OUT_MOUNT, merge
from streamrl.operator.settings import Settings
from streamrl.spec import API_VERSION, SpecError, load_job, parse_job

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("rljob-*.yaml"))
BODY = {"apiVersion": API_VERSION, "kind": "RLJob",
        "metadata": {"name": "hetero-counting", "uid": "0b7c-uid"}}
OWNER = owner_reference(BODY)
TOKEN = "0" * 64


def _children(path: Path, **kw) -> list[dict]:
    return build_children(load_job(path), "rl", Settings(), OWNER, TOKEN, **kw)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_object_validates_strictly(path):
    objects = _children(path)
    assert {o["kind"] for o in objects} >= {"ConfigMap", "Job", "Service", "Deployment"}
    for obj in objects:
        assert kubernetes_validate.validate(obj, "1.33", strict=True) == "1.33", obj["metadata"]["name"]
        retained = obj["kind"] == "PersistentVolumeClaim"  # kept after the job (checkpoint.volume.retain)
        assert obj["metadata"].get("ownerReferences") == (None if retained else [OWNER])
        assert obj["metadata"]["labels"]["streamrl.io/job"] == load_job(path).metadata.name
        assert obj["metadata"]["namespace"] == "rl"


def test_a_broken_object_is_caught_by_the_validator():
    [deployment] = [o for o in _children(ROOT / "deploy/examples/rljob-tiny-cpu.yaml") if o["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    with pytest.raises(kubernetes_validate.ValidationError, match="'gpus' was unexpected"):
        kubernetes_validate.validate(deployment, "1.33", strict=True)


def test_heterogeneous_pools_land_on_their_node_pools_with_their_gpus():
    children = _children(ROOT / "deploy/examples/rljob-heterogeneous.yaml")
    objects = {(o["kind"], o["metadata"]["name"]): o for o in children}
    expected = {
        ("Deployment", "hetero-counting-gen-l4"): ({"cloud.google.com/gke-accelerator": "nvidia-l4"}, 4),
        ("Deployment", "hetero-counting-gen-a100"): ({"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"}, 2),
        ("Job", "hetero-counting-trainer"): ({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, None),
    }
    for key, (node_selector, replicas) in expected.items():
        pod = objects[key]["spec"]["template"]["spec"]
        main = pod["containers"][0]
        assert pod["nodeSelector"] == node_selector
        assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"  # a quantity, as the API server stores it
        assert main["resources"]["requests"]["nvidia.com/gpu"] == "1"
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        # MKL starts with one thread; only the compute thread gets more (streamrl.compute)
        assert {"name": "MKL_NUM_THREADS", "value": "1"} in main["env"]
        if replicas is not None:
            assert objects[key]["spec"]["replicas"] == replicas
            assert objects[key]["spec"]["selector"]["matchLabels"]["streamrl.io/pool"] == key[1].rsplit("-", 1)[1]
    l4 = objects[("Deployment", "hetero-counting-gen-l4")]["spec"]["template"]["spec"]["containers"][0]
    assert l4["resources"]["requests"]["cpu"] == "4"
    assert "--pool" in l4["args"] and l4["args"][l4["args"].index("--pool") + 1] == "l4"
    assert l4["args"][l4["args"].index("--trainer") + 1] == "hetero-counting-trainer.rl.svc:50051"
    # skewness-aware dispatch: the ranker comes along, and the trainer is told where.
    assert ("Deployment", "hetero-counting-ranker") in objects and ("Service", "hetero-counting-ranker") in objects
    trainer_args = objects[("Job", "hetero-counting-trainer")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert trainer_args[trainer_args.index("--ranker") + 1] == "hetero-counting-ranker:50052"


def test_remote_pools_are_not_built_locally_and_tls_is_mounted():
    objects = _children(ROOT / "deploy/examples/rljob-cross-dc.yaml")
    deployments = [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"]
    assert deployments == ["cross-dc-counting-gen-local"]
    services = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "Service"}
    assert services["cross-dc-counting-trainer"]["type"] == "LoadBalancer"
    assert services["cross-dc-counting-trainer-ranks"]["clusterIP"] == "None"  # the rendezvous stays inside
    job = load_job(ROOT / "deploy/examples/rljob-cross-dc.yaml")
    remote = build_generators(job, "west", "rl", Settings(), "203.0.113.7:50051",
                              origin={"streamrl.io/origin-cluster": "home", "streamrl.io/origin-namespace": "rl"})
    assert kubernetes_validate.validate(remote, "1.33", strict=True)
    assert "ownerReferences" not in remote["metadata"]  # cannot cross clusters: a finalizer removes it
    assert remote["metadata"]["labels"]["streamrl.io/origin-cluster"] == "home"
    pod = remote["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "cross-dc-tls", "defaultMode": 0o440}} in pod["volumes"]
    assert {"name": "tls", "mountPath": "/etc/streamrl/tls", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert pod["containers"][0]["args"][pod["containers"][0]["args"].index("--trainer") + 1] == "203.0.113.7:50051"


def test_configmap_carries_the_spec_with_fixed_ports():
    objects = _children(ROOT / "deploy/examples/rljob-tiny-cpu.yaml")
    [cm] = [o for o in objects if o["kind"] == "ConfigMap"]
    loaded = parse_job(__import__("yaml").safe_load(cm["data"]["job.yaml"]))
    assert (loaded.spec.trainer.port, loaded.spec.trainer.admin_port) == (50051, 8080)
    assert loaded.spec.algorithm == load_job(ROOT / "deploy/examples/rljob-tiny-cpu.yaml").spec.algorithm


def test_user_template_merges_under_the_operator_part():
    job = parse_job({"metadata": {"name": "t"}, "spec": {"model": {"source": "builtin-tiny"},
                                                   "generators": {"pools": [{"name": "p", "placement": {
        "template": {"metadata": {"annotations": {"team": "rl"}},
                     "spec": {"serviceAccountName": "rl-sa", "priorityClassName": "high",
                              "containers": [{"name": MAIN, "env": [{"name": "HF_HOME", "value": "/hf"}],
                                              "args": ["ignored"]},
                                             {"name": "sidecar", "image": "busybox"}],
                              "volumes": [{"name": "hf", "emptyDir": {}}]}}}}]}}})
    deployment = build_generators(job, "p", "rl", Settings(), "t-trainer:50051")  # minted token: a Secret volume
    assert kubernetes_validate.validate(deployment, "1.33", strict=True)
    template = deployment["spec"]["template"]
    pod = template["spec"]
    assert template["metadata"]["annotations"]["team"] == "rl"
    assert template["metadata"]["labels"]["streamrl.io/pool"] == "p"
    assert (pod["serviceAccountName"], pod["priorityClassName"]) == ("rl-sa", "high")
    main, sidecar = pod["containers"]
    assert main["args"][0] == "generator"  # the operator's command wins
    assert {"name": "HF_HOME", "value": "/hf"} in main["env"] and any(e["name"] == "POD_NAME" for e in main["env"])
    assert sidecar == {"name": "sidecar", "image": "busybox"}
    assert [v["name"] for v in pod["volumes"]] == ["hf", "job", "out", "cache", "tmp", "dshm", "token"]


def test_merge_rules():
    assert merge({"a": 1, "b": {"c": 2}}, {"b": {"d": 3}}) == {"a": 1, "b": {"c": 2, "d": 3}}
    assert merge([{"name": "x", "v": 1}], [{"name": "x", "w": 2}, {"name": "y"}]) == \
        [{"name": "x", "v": 1, "w": 2}, {"name": "y"}]
    assert merge([1, 2], [3]) == [3]


def test_suspend_scales_to_zero_and_suspends_the_trainer():
    job = parse_job({"metadata": {"name": "s"}, "spec": {"model": {"source": "builtin-tiny"}, "suspend": True}})
    objects = build_children(job, "rl", Settings(), OWNER, TOKEN)
    assert [o["spec"]["replicas"] for o in objects if o["kind"] == "Deployment"] == [0]
    [trainer] = [o for o in objects if o["kind"] == "Job"]
    assert trainer["spec"]["suspend"] is True
    # marked as the operator's own suspension: the only one it lifts (not Kueue's, not a queue's)
    assert trainer["metadata"]["annotations"]["streamrl.io/suspended-by"] == "spec.suspend"


def test_total_replicas_are_spread_over_pools():
    job = parse_job({"metadata": {"name": "r"}, "spec": {"model": {"source": "builtin-tiny"}, "generators": {
        "replicas": 9, "pools": [{"name": "a", "replicas": 2}, {"name": "b", "replicas": 1}]}}})
    objects = build_children(job, "rl", Settings(), OWNER, TOKEN)
    assert {o["metadata"]["name"]: o["spec"]["replicas"] for o in objects if o["kind"] == "Deployment"} == \
        {"r-gen-a": 6, "r-gen-b": 3}
    assert generator_selector("r") == "streamrl.io/job=r,streamrl.io/role=generator"


def _sharded(nodes: int, per_node: int, name: str = "big", **trainer) -> list[dict]:
    job = parse_job({"metadata": {"name": name}, "spec": {"model": {"source": "builtin-tiny"}, "trainer": {
        "nodes": nodes, "processesPerNode": per_node, **trainer}}})
    return build_children(job, "rl", Settings(), OWNER, TOKEN)


@pytest.mark.parametrize("nodes, per_node", [(1, 1), (3, 2)])
def test_the_trainer_is_an_indexed_job_with_a_headless_service_and_rank_0_behind_its_service(nodes, per_node):
    objects = {(o["kind"], o["metadata"]["name"]): o for o in _sharded(nodes, per_node)}
    for obj in objects.values():
        assert kubernetes_validate.validate(obj, "1.33", strict=True) == "1.33", obj["metadata"]["name"]
    job = objects["Job", "big-trainer"]["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"]) == ("Indexed", nodes, nodes)
    assert job["backoffLimit"] == 0  # one pod failing fails the group; the operator restarts it whole
    assert {r["action"] for r in job["podFailurePolicy"]["rules"]} == {"FailJob"}
    assert job["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    pod = job["template"]["spec"]
    assert (pod["subdomain"], pod["restartPolicy"]) == ("big-trainer-ranks", "Never")
    headless = objects["Service", "big-trainer-ranks"]["spec"]
    assert (headless["clusterIP"], headless["publishNotReadyAddresses"]) == ("None", True)
    assert headless["selector"] == {"streamrl.io/job": "big", "streamrl.io/role": "trainer"}
    assert headless["selector"].items() <= job["template"]["metadata"]["labels"].items()
    front, admin = objects["Service", "big-trainer"]["spec"], objects["Service", "big-trainer-admin"]["spec"]
    assert front["selector"] == admin["selector"] == {"streamrl.io/job": "big", "streamrl.io/role": "trainer",
                                                      "batch.kubernetes.io/job-completion-index": "0"}
    assert [p["name"] for p in front["ports"]] == ["grpc"] and [p["name"] for p in admin["ports"]] == ["admin"]
    assert admin["type"] == "ClusterIP"
    # the operator reads /status of a trainer not ready yet (loading, resuming: N6); generators dial ready ones only
    assert admin["publishNotReadyAddresses"] is True and "publishNotReadyAddresses" not in front
    main = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    if nodes * per_node == 1:  # world size 1: the trainer as it always ran, no launcher
        assert "command" not in main
        assert main["args"][main["args"].index("--admin-port") + 1] == "8080"
        assert ports == {"grpc": 50051, "admin": 8080}
        return
    command = main["command"]
    assert command[:3] == ["python", "-m", "torch.distributed.run"]
    flag = {k: command[command.index(k) + 1] for k in ("--nnodes", "--nproc-per-node", "--node-rank",
                                                          "--master-addr", "--master-port")}
    assert flag == {"--nnodes": "3", "--nproc-per-node": "2", "--node-rank": "$(JOB_COMPLETION_INDEX)",
                    "--master-addr": "big-trainer-0.big-trainer-ranks.rl.svc", "--master-port": "29500"}
    assert command[command.index("--rdzv-conf") + 1] == "timeout=1800"  # trainer.startup.rendezvousSeconds
    assert command[-2:] == ["--no-python", "streamrl"] and main["args"][0] == "trainer"
    assert "--admin-port" not in main["args"]  # each rank serves its admin on 8080 + its local rank
    assert ports == {"grpc": 50051, "admin": 8080, "admin-r1": 8081, "rendezvous": 29500}


def test_the_rendezvous_waits_as_long_as_the_spec_says_and_torch_distributed_run_reads_it():
    """N6: a group whose last node is still being provisioned waits rendezvousSeconds, not
    torch's default of 600 s; static rendezvous reads `timeout` from --rdzv-conf."""
    from torch.distributed.run import config_from_args, get_args_parser

    [job] = [o for o in _sharded(2, 1, startup={"rendezvousSeconds": 5400}) if o["kind"] == "Job"]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    command = [c.replace("$(JOB_COMPLETION_INDEX)", "1") for c in command]  # as the kubelet expands it
    config = config_from_args(get_args_parser().parse_args(command[3:] + ["trainer"]))[0]
    assert (config.rdzv_backend, config.rdzv_configs["timeout"]) == ("static", "5400")


def test_a_name_too_long_for_every_child_is_refused_with_the_field_named():
    with pytest.raises(SpecError, match="metadata.name: .* at most 49 characters"):
        _sharded(12, 1, name="a-job-name-long-enough-that-its-trainer-pods-overflow-x")


def trainer_job(settings: Settings | None = None, **spec) -> dict:
    job = parse_job({"metadata": {"name": "h"}, "spec": {"model": {"source": "builtin-tiny"}, **spec}})
    return next(o for o in build_children(job, "rl", settings or Settings(), OWNER, TOKEN) if o["kind"] == "Job")


def test_the_template_hash_changes_with_what_a_job_cannot_change_and_not_with_suspend():
    def digest(obj: dict) -> str:
        return obj["metadata"]["annotations"][TEMPLATE_HASH]

    base = trainer_job()
    assert digest(trainer_job(suspend=True)) == digest(base)
    assert digest(trainer_job(trainer={"nodes": 2})) != digest(base)
    assert digest(trainer_job(image="streamrl:other")) != digest(base)
    assert digest(trainer_job(algorithm={"numIterations": 99})) != digest(base)
    assert digest(trainer_job(trainer={"placement": {"gpus": 1}})) != digest(base)
    job = parse_job({"metadata": {"name": "h"}, "spec": {"model": {"source": "builtin-tiny"}}})
    assert template_hash(job) == digest(base)


def test_an_operator_upgrade_or_an_operator_only_field_never_replaces_a_running_trainer_group():
    """N5: the hash leaves out what the operator injects (its images, pull secrets, pull policy,
    its own restart budget) and what the trainer reads only when it starts."""
    base = trainer_job()
    upgraded = Settings(image="ghcr.io/streamrl/streamrl:0.2.0", cuda_image="ghcr.io/streamrl/streamrl:0.2.0-cuda",
                        image_pull_secrets=("regcred",), image_pull_policy="Always", trainer_backoff_limit=7)
    more_pools = {"pools": [{"name": "default", "replicas": 3}, {"name": "extra", "replicas": 1}]}
    for other in (trainer_job(upgraded), trainer_job(trainer={"restartLimit": 9, "minGenerators": 2}),
                  trainer_job(generators=more_pools),
                  trainer_job(ranker={"predictor": "causal-lm", "modelPath": "/models/r"}),
                  trainer_job(checkpoint={"everyIterations": 3, "keep": 5}),
                  trainer_job(trainer={"startup": {"loadSeconds": 7200, "rendezvousSeconds": 3600}})):
        assert other["metadata"]["annotations"][TEMPLATE_HASH] == base["metadata"]["annotations"][TEMPLATE_HASH]
    assert trainer_job(upgraded)["spec"]["template"] != base["spec"]["template"]  # what a new group would get
    assert base["metadata"]["annotations"]["streamrl.io/operator-version"] == "0.1.0"


def _objects(nodes: int = 1, per_node: int = 1, **spec) -> dict[tuple[str, str], dict]:
    job = parse_job({"metadata": {"name": "ck"}, "spec": {"model": {"source": "builtin-tiny"},
                                                          "trainer": {"nodes": nodes, "processesPerNode": per_node},
                                                          **spec}})
    objects = build_children(job, "rl", Settings(), OWNER, TOKEN)
    for obj in objects:
        assert kubernetes_validate.validate(obj, "1.33", strict=True) == "1.33", obj["metadata"]["name"]
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def _out_volume(objects: dict, name: str = "ck-trainer") -> dict:
    pod = objects["Job", name]["spec"]["template"]["spec"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "out"]
    assert mount["mountPath"] == OUT_MOUNT  # the trainer's --out
    assert pod["containers"][0]["args"][pod["containers"][0]["args"].index("--out") + 1] == OUT_MOUNT
    [volume] = [v for v in pod["volumes"] if v["name"] == "out"]
    return volume


@pytest.mark.parametrize("nodes, volume, mode", [
    (1, {"size": "50Gi", "storageClass": "premium-rwo"}, "ReadWriteOnce"),
    (3, {"size": "1Ti", "storageClass": "filestore"}, "ReadWriteMany"),  # every node writes its shards
    (3, {"size": "1Ti", "accessMode": "ReadWriteOnce"}, "ReadWriteOnce"),  # said so: taken as said
])
def test_the_checkpoint_claim_is_created_with_its_size_class_and_mode_and_mounted_as_the_run_directory(
        nodes, volume, mode):
    objects = _objects(nodes, checkpoint={"volume": volume})
    claim = objects["PersistentVolumeClaim", "ck-checkpoints"]
    assert claim["spec"]["accessModes"] == [mode]
    assert claim["spec"]["resources"] == {"requests": {"storage": volume["size"]}}
    assert claim["spec"].get("storageClassName") == volume.get("storageClass")
    assert "ownerReferences" not in claim["metadata"]  # retained: the garbage collector leaves it
    assert claim["metadata"]["labels"]["streamrl.io/job"] == "ck"
    assert _out_volume(objects) == {"name": "out", "persistentVolumeClaim": {"claimName": "ck-checkpoints"}}
    # Only the trainer's run directory: a generator keeps its own disk.
    gen = objects["Deployment", "ck-gen-default"]["spec"]["template"]["spec"]
    assert {"name": "out", "emptyDir": {}} in gen["volumes"]


def test_an_existing_claim_is_mounted_and_none_is_created():
    objects = _objects(2, checkpoint={"volume": {"claimName": "team-ckpt"}})
    assert not [k for k in objects if k[0] == "PersistentVolumeClaim"]
    assert _out_volume(objects) == {"name": "out", "persistentVolumeClaim": {"claimName": "team-ckpt"}}


def test_a_claim_not_retained_carries_the_owner_reference():
    claim = _objects(checkpoint={"volume": {"retain": False}})["PersistentVolumeClaim", "ck-checkpoints"]
    assert claim["metadata"]["ownerReferences"] == [OWNER]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and "storageClassName" not in claim["spec"]


def test_without_a_volume_the_run_directory_is_the_pods_own_disk():
    objects = _objects()
    assert not [k for k in objects if k[0] == "PersistentVolumeClaim"]
    assert _out_volume(objects) == {"name": "out", "emptyDir": {}}


def test_the_pod_failure_policy_tells_a_preemption_and_a_disruption_from_a_failure():
    """Rules match in order: exit 75 (saved on SIGTERM) first, a disruption next, any other
    non-zero exit last; the Job's Failed message names the rule, the operator reads it."""
    rules = _objects()["Job", "ck-trainer"]["spec"]["podFailurePolicy"]["rules"]
    assert rules == [
        {"action": "FailJob",
         "onExitCodes": {"containerName": MAIN, "operator": "In", "values": [PREEMPTED_EXIT_CODE]}},
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": MAIN, "operator": "NotIn", "values": [0]}},
    ]


@pytest.mark.parametrize("template, grace", [(None, TRAINER_GRACE_S),
                                             ({"spec": {"terminationGracePeriodSeconds": 900}}, 900)])
def test_a_trainer_pod_has_time_to_save_after_sigterm_and_its_launcher_waits_for_its_ranks(template, grace):
    placement = {"placement": {"template": template}} if template else {}
    job = parse_job({"metadata": {"name": "ck"}, "spec": {"model": {"source": "builtin-tiny"}, "trainer": {
        "nodes": 2, "processesPerNode": 2, **placement}}})
    [trainer] = [o for o in build_children(job, "rl", Settings(), OWNER, TOKEN) if o["kind"] == "Job"]
    assert kubernetes_validate.validate(trainer, "1.33", strict=True) == "1.33"
    pod = trainer["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace
    command, args = pod["containers"][0]["command"], pod["containers"][0]["args"]
    assert int(command[command.index("--shutdown-timeout") + 1]) == grace - 15  # torchrun's default is 30 s
    assert args[args.index("--preempted-exit-code") + 1] == str(PREEMPTED_EXIT_CODE)  # not 0: not "done"
