"""Every role's pod template as a real cluster admits and runs it: Pod Security "restricted",
a read-only root with a writable /tmp, no service-account token, /dev/shm in memory, the image
for the role's device, pull secrets, the job's token as a file, Kueue's label, a config hash
that rolls a role when (and only when) what it loads changes."""

import base64
import copy
import re
from pathlib import Path

import pytest
import yaml

from streamrl.operator.builders import build_children, build_generators
from streamrl.operator.names import owner_reference
from streamrl.operator.settings import Settings
from streamrl.spec import API_VERSION, RLJob, SpecError, load_job, parse_job
from tests.k8stools import psa_restricted_problems

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("rljob-*.yaml"))
OWNER = owner_reference({"apiVersion": API_VERSION, "kind": "RLJob", "metadata": {"name": "any", "uid": "u-1"}})
TOKEN = "5f" * 32
CPU_IMAGE, CUDA_IMAGE = "registry.example/streamrl:1.2", "registry.example/streamrl:1.2-cuda"
SETTINGS = Settings(image=CPU_IMAGE, cuda_image=CUDA_IMAGE, image_pull_secrets=("regcred",))
QUEUE = "kueue.x-k8s.io/queue-name"
CONFIG_HASH = "streamrl.io/config-hash"


def _job(name: str = "p", labels: dict | None = None, **spec) -> RLJob:
    meta = {"name": name, **({"labels": labels} if labels else {})}
    return parse_job({"metadata": meta, "spec": {"model": {"source": "builtin-tiny"}, **spec}})


def _example(file: str, **spec) -> RLJob:
    raw = yaml.safe_load((ROOT / "deploy" / "examples" / file).read_text())
    raw["spec"].update(spec)
    return parse_job(raw)


SKEWNESS = {"dispatch": {"policy": "skewness-aware"}, "pools": [{"name": "a", "replicas": 2}]}
JOBS = {
    **{p.name: (lambda p=p: load_job(p)) for p in EXAMPLES},
    "sharded-2-nodes": lambda: _job("big", trainer={"nodes": 2, "processesPerNode": 2}),
    "skewness-aware": lambda: _job("sk", generators=SKEWNESS),
}


def _children(job: RLJob, settings: Settings = SETTINGS, token: str | None = TOKEN, **kw) -> dict:
    return {(o["kind"], o["metadata"]["name"]): o for o in build_children(job, "rl", settings, OWNER, token, **kw)}


def _templates(objects: dict) -> dict[str, dict]:
    """Each workload's pod template by the workload's name (the trainer Job, every Deployment)."""
    return {name: o["spec"]["template"] for (kind, name), o in objects.items() if kind in ("Job", "Deployment")}


def _main(template: dict) -> dict:
    [main] = [c for c in template["spec"]["containers"] if c["name"] == "main"]
    return main


def _volume(template: dict, name: str) -> dict | None:
    return next((v for v in template["spec"]["volumes"] if v["name"] == name), None)


def _mount(template: dict, name: str) -> dict | None:
    return next((m for m in _main(template)["volumeMounts"] if m["name"] == name), None)


# ---- Pod Security "restricted", the root filesystem, the service-account token ------------
@pytest.mark.parametrize("make", JOBS.values(), ids=JOBS.keys())
def test_every_workload_pod_passes_pod_security_restricted(make):
    templates = _templates(_children(make()))
    assert any(n.endswith("-trainer") for n in templates) and any("-gen-" in n for n in templates)
    for name, template in templates.items():
        assert psa_restricted_problems(template["spec"]) == [], name


def test_the_ranker_and_a_remote_pool_pass_pod_security_restricted():
    ranker = _templates(_children(JOBS["skewness-aware"]()))["sk-ranker"]
    assert psa_restricted_problems(ranker["spec"]) == []
    remote = build_generators(load_job(ROOT / "deploy/examples/rljob-cross-dc.yaml"), "west", "rl", SETTINGS,
                              "203.0.113.7:50051", origin={"streamrl.io/origin-cluster": "home"})
    assert psa_restricted_problems(remote["spec"]["template"]["spec"]) == []


def test_the_restricted_checker_names_what_the_profile_refuses():
    pod = copy.deepcopy(_templates(_children(_job()))["p-trainer"]["spec"])
    # the pod template before the perimeter work: no seccomp profile anywhere (review S1-17)
    del pod["securityContext"]["seccompProfile"]
    del pod["containers"][0]["securityContext"]["seccompProfile"]
    assert psa_restricted_problems(pod) == [
        "containers main: seccompProfile unset (neither the container nor the pod sets RuntimeDefault or Localhost)"]
    pod["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    pod["hostNetwork"] = True
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/var/run"}})
    pod["initContainers"] = [{"name": "init", "image": "busybox", "ports": [{"containerPort": 80, "hostPort": 80}],
                              "securityContext": {"runAsUser": 0, "runAsNonRoot": False, "privileged": True,
                                                  "capabilities": {"add": ["SYS_ADMIN", "NET_BIND_SERVICE"]},
                                                  "seccompProfile": {"type": "RuntimeDefault"}}}]
    assert psa_restricted_problems(pod) == [
        "volume host: type hostPath not allowed",
        "pod: hostNetwork",
        "pod: seccompProfile Unconfined",
        "initContainers init: runAsUser 0",
        "initContainers init: privileged",
        "initContainers init: allowPrivilegeEscalation is not false",
        "initContainers init: capabilities.drop lacks ALL",
        "initContainers init: capabilities.add SYS_ADMIN not allowed",
        "initContainers init: runAsNonRoot false",
        "initContainers init: hostPort",
        "containers main: seccompProfile unset (neither the container nor the pod sets RuntimeDefault or Localhost)",
    ]


@pytest.mark.parametrize("make", JOBS.values(), ids=JOBS.keys())
def test_the_root_filesystem_is_read_only_with_tmp_writable_as_home(make):
    for name, template in _templates(_children(make())).items():
        main = _main(template)
        assert main["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert _volume(template, "tmp") == {"name": "tmp", "emptyDir": {}}, name
        assert _mount(template, "tmp") == {"name": "tmp", "mountPath": "/tmp"}, name  # not read-only
        assert {"name": "HOME", "value": "/tmp"} in main["env"], name
        assert template["spec"]["automountServiceAccountToken"] is False, name


def test_a_template_that_asks_for_the_service_account_token_keeps_it():
    job = _job(generators={"pools": [{"name": "wi", "placement": {"template": {"spec": {
        "serviceAccountName": "workload-identity", "automountServiceAccountToken": True}}}}]})
    templates = _templates(_children(job))
    gen = templates["p-gen-wi"]["spec"]
    assert (gen["serviceAccountName"], gen["automountServiceAccountToken"]) == ("workload-identity", True)
    assert templates["p-trainer"]["spec"]["automountServiceAccountToken"] is False  # only where asked


# ---- /dev/shm, images, pull secrets, quantities ---------------------------------------------
@pytest.mark.parametrize("file, sizes", [
    ("rljob-heterogeneous.yaml", {"hetero-counting-trainer": "16Gi", "hetero-counting-gen-l4": "16Gi",
                                  "hetero-counting-gen-a100": "16Gi", "hetero-counting-ranker": None}),
    ("rljob-tiny-cpu.yaml", {"tiny-counting-trainer": "512Mi", "tiny-counting-gen-default": "512Mi"}),
])
def test_dev_shm_is_in_memory_on_the_trainer_and_generators_sized_by_their_gpus(file, sizes):
    templates = _templates(_children(load_job(ROOT / "deploy" / "examples" / file)))
    assert set(templates) == set(sizes)
    for name, size in sizes.items():
        if size is None:
            assert _volume(templates[name], "dshm") is None and _mount(templates[name], "dshm") is None
            continue
        assert _volume(templates[name], "dshm") == {"name": "dshm", "emptyDir": {"medium": "Memory",
                                                                             "sizeLimit": size}}, name
        assert _mount(templates[name], "dshm") == {"name": "dshm", "mountPath": "/dev/shm"}, name


IMAGES = {
    "rljob-heterogeneous.yaml": {"hetero-counting-trainer": CUDA_IMAGE, "hetero-counting-gen-l4": CUDA_IMAGE,
                                 "hetero-counting-gen-a100": CUDA_IMAGE, "hetero-counting-ranker": CPU_IMAGE},
    "rljob-sharded-trainer.yaml": {"sharded-math-trainer": CUDA_IMAGE, "sharded-math-gen-l4": CUDA_IMAGE,
                                   "sharded-math-ranker": CPU_IMAGE},
    "rljob-tiny-cpu.yaml": {"tiny-counting-trainer": CPU_IMAGE, "tiny-counting-gen-default": CPU_IMAGE},
    "rljob-cross-dc.yaml": {"cross-dc-counting-trainer": CPU_IMAGE, "cross-dc-counting-gen-local": CPU_IMAGE},
}


@pytest.mark.parametrize("file", IMAGES)
def test_each_role_runs_the_image_of_its_device_and_spec_image_overrides_every_one(file):
    assert {p.name for p in EXAMPLES} == set(IMAGES)
    templates = _templates(_children(_example(file)))
    assert {n: _main(t)["image"] for n, t in templates.items()} == IMAGES[file]
    assert {_main(t)["imagePullPolicy"] for t in templates.values()} == {"IfNotPresent"}
    own = _templates(_children(_example(file, image="team.example/rl:7")))
    assert {n: _main(t)["image"] for n, t in own.items()} == dict.fromkeys(IMAGES[file], "team.example/rl:7")


def test_a_causal_lm_ranker_on_cuda_runs_the_cuda_image():
    job = _job(generators=SKEWNESS, ranker={"predictor": "causal-lm", "modelPath": "/models/r", "device": "cuda",
                                            "placement": {"gpus": 1}})
    assert _main(_templates(_children(job))["p-ranker"])["image"] == CUDA_IMAGE


def test_a_role_on_cuda_without_gpus_is_refused_with_the_field_named():
    """A pod sees only the GPUs it asks for: a CUDA role with none would fail at its first CUDA call."""
    cases = [({"trainer": {"device": "cuda"}}, "spec.trainer.placement.gpus"),
             ({"generators": {"pools": [{"name": "a", "engine": {"type": "torch", "device": "cuda"}}]}},
              "spec.generators.pools[0].placement.gpus"),
             ({"generators": SKEWNESS, "ranker": {"predictor": "causal-lm", "modelPath": "/m", "device": "cuda"}},
              "spec.ranker.placement.gpus")]
    for spec, where in cases:
        with pytest.raises(SpecError, match=rf"{re.escape(where)}: 0, but the role runs on cuda"):
            _children(_job(**spec))


def test_a_pod_without_gpus_sees_none():
    """Where a node's default runtime is NVIDIA's, a pod that asked for no GPU would otherwise see them all."""
    templates = _templates(_children(load_job(ROOT / "deploy/examples/rljob-heterogeneous.yaml")))
    env = {n: {e["name"]: e.get("value") for e in _main(t)["env"]} for n, t in templates.items()}
    assert env["hetero-counting-ranker"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "NVIDIA_VISIBLE_DEVICES" not in env["hetero-counting-trainer"]  # the device plugin sets it


@pytest.mark.parametrize("make", JOBS.values(), ids=JOBS.keys())
def test_every_pod_pulls_with_the_operators_pull_secrets(make):
    job = make()
    for name, template in _templates(_children(job)).items():
        assert template["spec"]["imagePullSecrets"] == [{"name": "regcred"}], name
    two = Settings(image_pull_secrets=("regcred", "mirror"))
    for name, template in _templates(_children(job, two)).items():
        assert template["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}], name
    for name, template in _templates(_children(job, Settings())).items():
        assert "imagePullSecrets" not in template["spec"], name


def test_a_remote_pools_deployment_pulls_with_the_pull_secrets():
    remote = build_generators(load_job(ROOT / "deploy/examples/rljob-cross-dc.yaml"), "west", "rl", SETTINGS,
                              "203.0.113.7:50051", origin={"streamrl.io/origin-cluster": "home"})
    assert remote["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_quantities_are_strings_as_the_api_server_stores_them():
    templates = _templates(_children(load_job(ROOT / "deploy/examples/rljob-heterogeneous.yaml")))
    assert _main(templates["hetero-counting-trainer"])["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    assert _main(templates["hetero-counting-gen-l4"])["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    sharded = _templates(_children(load_job(ROOT / "deploy/examples/rljob-sharded-trainer.yaml")))
    assert _main(sharded["sharded-math-trainer"])["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    # numbers in the spec (YAML `cpu: 4`) become strings too
    job = _job(generators={"pools": [{"name": "n", "placement": {
        "gpus": 2, "resources": {"requests": {"cpu": 4}, "limits": {"cpu": 6, "memory": "8Gi"}}}}]})
    assert _main(_templates(_children(job))["p-gen-n"])["resources"] == {
        "requests": {"cpu": "4", "nvidia.com/gpu": "2"}, "limits": {"cpu": "6", "memory": "8Gi", "nvidia.com/gpu": "2"}}


def test_the_ranker_gets_default_requests_unless_its_placement_names_some():
    ranker = _main(_templates(_children(_job(generators=SKEWNESS)))["p-ranker"])
    assert ranker["resources"] == {"requests": {"cpu": "250m", "memory": "512Mi"}}  # not BestEffort
    own = _job(generators=SKEWNESS, ranker={"placement": {"resources": {"requests": {"cpu": 1}}}})
    assert _main(_templates(_children(own))["p-ranker"])["resources"] == {"requests": {"cpu": "1"}}


# ---- the job's token ----------------------------------------------------------------------
@pytest.mark.parametrize("make", JOBS.values(), ids=JOBS.keys())
def test_the_minted_token_is_a_read_only_file_and_never_in_the_environment(make):
    job = make()
    objects = _children(job)
    j = job.metadata.name
    secret = objects["Secret", f"{j}-token"]
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    for name, template in _templates(objects).items():
        assert _volume(template, "token") == {"name": "token", "secret": {"secretName": f"{j}-token",
                                                                          "defaultMode": 0o440}}, name
        assert _mount(template, "token") == {"name": "token", "mountPath": "/etc/streamrl/token",
                                             "readOnly": True}, name
        for container in template["spec"]["containers"]:
            assert "envFrom" not in container, name
            for env in container.get("env", []):
                assert env.get("value") != TOKEN, (name, env)
                assert "secretKeyRef" not in env.get("valueFrom", {}), (name, env)
    loaded = yaml.safe_load(objects["ConfigMap", f"{j}-spec"]["data"]["job.yaml"])
    assert loaded["spec"]["security"]["tokenFile"] == "/etc/streamrl/token/token"
    assert TOKEN not in objects["ConfigMap", f"{j}-spec"]["data"]["job.yaml"]


def test_a_minted_token_must_be_passed_to_build_children():
    with pytest.raises(ValueError, match="token"):
        build_children(_job(), "rl", SETTINGS, OWNER)


def test_a_job_with_its_own_token_file_gets_no_minted_token():
    job = _job(security={"tokenFile": "/var/run/secrets/rl/token"})
    objects = _children(job, token=None)
    assert not [k for k in objects if k[0] == "Secret"]
    for name, template in _templates(objects).items():
        assert _volume(template, "token") is None and _mount(template, "token") is None, name
    loaded = yaml.safe_load(objects["ConfigMap", "p-spec"]["data"]["job.yaml"])
    assert loaded["spec"]["security"]["tokenFile"] == "/var/run/secrets/rl/token"


# ---- Kueue, disruption, rollouts ----------------------------------------------------------
def test_kueues_queue_label_reaches_the_trainer_job_and_the_deployments_and_the_job_starts_suspended():
    objects = _children(_job("q", labels={QUEUE: "team-a"}, generators=SKEWNESS))
    trainer = objects["Job", "q-trainer"]
    assert trainer["metadata"]["labels"][QUEUE] == "team-a"
    assert trainer["spec"]["suspend"] is True  # Kueue admits it (and un-suspends it)
    deployments = {n: o for (k, n), o in objects.items() if k == "Deployment"}
    assert set(deployments) == {"q-ranker", "q-gen-a"}
    for name, deployment in deployments.items():
        assert deployment["metadata"]["labels"][QUEUE] == "team-a", name
        assert deployment["spec"]["template"]["metadata"]["labels"][QUEUE] == "team-a", name
        assert deployment["spec"]["replicas"] == 0, name  # held: no GPU before Kueue admits the trainer
    assert "streamrl.io/suspended-by" not in trainer["metadata"]["annotations"]  # Kueue's suspension, not ours


def test_without_the_queue_label_nothing_carries_it_and_the_job_runs():
    objects = _children(_job("q", labels={"team": "rl"}, generators=SKEWNESS))
    assert objects["Job", "q-trainer"]["spec"]["suspend"] is False
    for key, obj in objects.items():
        assert QUEUE not in obj["metadata"]["labels"], key
    for name, template in _templates(objects).items():
        assert QUEUE not in template["metadata"]["labels"], name


def test_only_trainer_pods_ask_node_autoscalers_not_to_evict_them():
    templates = _templates(_children(_job(generators=SKEWNESS)))
    annotations = templates["p-trainer"]["metadata"]["annotations"]
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert annotations["karpenter.sh/do-not-disrupt"] == "true"
    for name in ("p-ranker", "p-gen-a"):
        assert set(templates[name]["metadata"]["annotations"]) == {CONFIG_HASH}, name


def test_generator_rollouts_replace_one_pod_at_a_time_without_a_surge_pod():
    objects = _children(load_job(ROOT / "deploy/examples/rljob-heterogeneous.yaml"))
    for name in ("hetero-counting-gen-l4", "hetero-counting-gen-a100"):
        assert objects["Deployment", name]["spec"]["strategy"] == {
            "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert objects["Deployment", "hetero-counting-ranker"]["spec"]["strategy"] == {"type": "Recreate"}


# ---- the config hash ----------------------------------------------------------------------
BASE = {"algorithm": {"learningRate": 1.0e-4},
        "generators": {"dispatch": {"policy": "skewness-aware"}, "pools": [
            {"name": "a", "replicas": 2, "engine": {"type": "torch", "maxBatchSize": 64}},
            {"name": "b", "replicas": 1, "engine": {"type": "torch", "maxBatchSize": 64}}]}}


def _hashes(change=None) -> dict[str, str]:
    """The config hash of every pod template of BASE, changed by `change(spec)`."""
    spec = copy.deepcopy(BASE)
    if change:
        change(spec)
    return {name: t["metadata"]["annotations"][CONFIG_HASH] for name, t in _templates(_children(_job(**spec))).items()}


def test_every_pod_template_carries_a_config_hash():
    base = _hashes()
    assert set(base) == {"p-trainer", "p-ranker", "p-gen-a", "p-gen-b"}
    assert all(len(h) == 16 for h in base.values())
    assert base["p-trainer"] != base["p-ranker"]  # the ranker's section is the ranker's alone


def test_what_no_pod_acts_on_rolls_nothing():
    base = _hashes()

    def elsewhere(spec):
        spec["checkpoint"] = {"volume": {"size": "2Ti"}}
        spec.setdefault("trainer", {})["service"] = {"annotations": {"a": "b"}}

    assert _hashes(elsewhere) == base

    def ranker_only(spec):
        spec.setdefault("ranker", {})["window"] = 1000

    changed = _hashes(ranker_only)
    assert {n for n in base if changed[n] != base[n]} == {"p-ranker"}


def test_a_spec_change_the_pods_load_rolls_every_role():
    base = _hashes()

    def lr(spec):
        spec["algorithm"]["learningRate"] = 2.0e-4

    changed = _hashes(lr)
    assert {n for n in base if changed[n] != base[n]} == set(base)


@pytest.mark.parametrize("change", [
    lambda s: s["generators"].update(replicas=7),
    lambda s: s["generators"]["pools"][0].update(replicas=5),
    lambda s: s["generators"]["pools"][1].update(placement={"gpus": 1, "nodeSelector": {"pool": "l4"}}),
    lambda s: s.update(trainer={"placement": {"nodeSelector": {"pool": "h100"}, "resources": {
        "requests": {"cpu": "8"}}}}),
    lambda s: s.update(ranker={"placement": {"resources": {"requests": {"cpu": "1"}}}}),
    lambda s: s.update(autoscaling={"mode": "Internal", "intervalSeconds": 30}),
    lambda s: s["generators"]["pools"][0].update(minReplicas=1, maxReplicas=8, cost=2.5),
], ids=["total-replicas", "pool-replicas", "pool-placement", "trainer-placement", "ranker-placement",
        "autoscaling", "pool-bounds-and-cost"])
def test_replicas_placement_and_autoscaling_roll_nothing(change):
    assert _hashes(change) == _hashes()


def test_a_pools_engine_change_rolls_that_pool_alone():
    base = _hashes()

    def engine(spec):
        spec["generators"]["pools"][0]["engine"]["maxBatchSize"] = 128

    changed = _hashes(engine)
    assert {n for n in base if changed[n] != base[n]} == {"p-gen-a"}


def test_generators_mount_their_own_certificate_when_the_spec_gives_them_one():
    """Review S2-4: the trainer's key stays off generator nodes (another datacenter's, say)."""
    tls = {"secretName": "trainer-tls", "generatorSecretName": "gen-tls", "generatorServerName": "streamrl-generator"}
    templates = _templates(_children(_job(generators=SKEWNESS, security={"tls": tls})))
    secrets = {n: next(v["secret"]["secretName"] for v in t["spec"]["volumes"] if v["name"] == "tls")
               for n, t in templates.items()}
    assert secrets == {"p-trainer": "trainer-tls", "p-ranker": "trainer-tls", "p-gen-a": "gen-tls"}


def test_a_startup_bound_rolls_only_the_trainer():
    base = _hashes()

    def startup(spec):
        spec["trainer"] = {"startup": {"loadSeconds": 7200}}

    changed = _hashes(startup)
    assert {n for n in base if changed[n] != base[n]} == {"p-trainer"}


# ---- start-up (N6), where services listen (N19) ---------------------------------------------
def _startup_s(template: dict) -> int:
    probe = _main(template)["startupProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "admin"}
    return probe["periodSeconds"] * probe["failureThreshold"]


def test_a_one_process_trainers_startup_probe_covers_its_start_not_its_model_load():
    """Its admin server starts before the model loads (under trainer.startup.loadSeconds), so
    the probe needs only the imports: a long load never gets the pod killed by the kubelet."""
    templates = _templates(_children(_job(trainer={"startup": {"loadSeconds": 7200, "resumeSeconds": 7200}})))
    assert _startup_s(templates["p-trainer"]) == 120
    assert {_startup_s(t) for n, t in templates.items() if n != "p-trainer"} == {600}  # the other roles keep theirs


@pytest.mark.parametrize("rendezvous, expected", [(None, 1800 + 300), (5400, 5400 + 300)])
def test_a_process_groups_startup_probe_covers_its_rendezvous_bound_and_a_margin(rendezvous, expected):
    startup = {"startup": {"rendezvousSeconds": rendezvous}} if rendezvous else {}
    templates = _templates(_children(_job("big", trainer={"nodes": 2, "processesPerNode": 2, **startup})))
    assert _startup_s(templates["big-trainer"]) == expected


@pytest.mark.parametrize("make", JOBS.values(), ids=JOBS.keys())
def test_every_service_listens_on_every_address_ipv4_and_ipv6(make):
    """N19: `::` is a dual-stack socket: probes, Services and peers reach it on IPv6-only
    clusters too (and on IPv4 ones, as before)."""
    for name, template in _templates(_children(make())).items():
        args = _main(template)["args"]
        assert args[args.index("--host") + 1] == "::", name
