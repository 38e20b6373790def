"""The trainer pod's command as the operator builds it, run here: torch.distributed.run starts
the pod's two ranks (node rank from $(JOB_COMPLETION_INDEX), as the kubelet expands it), a
generator started with its Deployment's arguments dials rank 0, and the run finishes with
every sample accepted once, every call carrying the job's minted token. What cannot run here
is swapped, and only that: the configmap's fixed ports for free ones, the index-0 pod's DNS
name for loopback, the mounts for folders and files."""

from __future__ import annotations

import base64
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamrl.local.ports import free_port
from streamrl.operator.builders import TOKEN_FILE, build_children
from streamrl.operator.pods import JOB_FILE, OUT_MOUNT
from streamrl.operator.settings import Settings
from streamrl.records import RunSummary, TrainerPhase
from streamrl.spec import load_job
from tests.conftest import child_env

pytestmark = pytest.mark.slow

ITERATIONS, PROMPTS, GROUP = 4, 8, 4


def _two_free_ports() -> int:
    """p with p and p + 1 free (local ranks 0 and 1 serve their admin on the base port + rank)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports on loopback in 50 tries")


def _kubelet(argv: list[str], env: dict[str, str], files: dict[str, str]) -> list[str]:
    """Expand $(VAR) as the kubelet does, and point the mounts at folders."""
    out = []
    for arg in argv:
        arg = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)
        out.append(files.get(arg, arg))
    return out


def test_the_trainer_pods_command_runs_two_ranks_that_train_with_a_generator(write_job, tmp_path):
    job = load_job(write_job({"spec": {
        "algorithm": {"numIterations": ITERATIONS, "promptsPerStep": PROMPTS, "groupSize": GROUP},
        "pipeline": {"mode": "stream-sync"},
        "trainer": {"processesPerNode": 2, "processGroupTimeoutSeconds": 60},
    }}))
    objects = {(o["kind"], o["metadata"]["name"]): o for o in build_children(job, "rl", Settings(), token="t0k3n")}
    name = job.metadata.name
    configmap = yaml.safe_load(objects["ConfigMap", f"{name}-spec"]["data"]["job.yaml"])
    # Every role presents and checks the job's minted token, read from the Secret's file.
    assert configmap["spec"]["security"]["tokenFile"] == TOKEN_FILE
    token_file = tmp_path / "token"
    token_file.write_bytes(base64.b64decode(objects["Secret", f"{name}-token"]["data"]["token"]))
    configmap["spec"]["security"]["tokenFile"] = str(token_file)
    grpc_port, admin_base, rendezvous = free_port(), _two_free_ports(), free_port()
    configmap["spec"]["trainer"].update({"port": grpc_port, "adminPort": admin_base})
    job_file, out = tmp_path / "configmap-job.yaml", tmp_path / "out"
    job_file.write_text(yaml.safe_dump(configmap))
    files = {JOB_FILE: str(job_file), OUT_MOUNT: str(out), f"{name}-trainer-0.{name}-trainer-ranks.rl.svc":
             "127.0.0.1", "29500": str(rendezvous), "python": sys.executable}

    trainer = objects["Job", f"{name}-trainer"]["spec"]["template"]["spec"]["containers"][0]
    trainer_argv = _kubelet(trainer["command"] + trainer["args"], {"JOB_COMPLETION_INDEX": "0"}, files)
    generator = objects["Deployment", f"{name}-gen-default"]["spec"]["template"]["spec"]["containers"][0]
    generator_argv = _kubelet(["streamrl"] + generator["args"], {"POD_NAME": "gen-0", "POD_IP": "127.0.0.1"}, files)
    for flag, value in (("--trainer", f"127.0.0.1:{grpc_port}"), ("--admin-port", str(free_port())),
                        ("--relay-port", str(free_port()))):
        generator_argv[generator_argv.index(flag) + 1] = value
    env = dict(child_env(), PATH=f"{Path(sys.executable).parent}:{child_env()['PATH']}")
    logs = tmp_path / "trainer.log", tmp_path / "generator.log"
    with logs[0].open("w") as tlog, logs[1].open("w") as glog:
        pod = subprocess.Popen(trainer_argv, env=env, stdout=tlog, stderr=subprocess.STDOUT)
        gen = subprocess.Popen(generator_argv, env=env, stdout=glog, stderr=subprocess.STDOUT)
        try:
            assert pod.wait(timeout=420) == 0, logs[0].read_text()[-4000:]
            assert gen.wait(timeout=60) == 0, logs[1].read_text()[-4000:]
        finally:
            for proc in (pod, gen):
                if proc.poll() is None:
                    proc.kill()
    summary = RunSummary.read(out / "summary.json")
    assert summary.phase == TrainerPhase.SUCCEEDED and summary.num_iterations == ITERATIONS
    assert summary.num_samples_accepted == ITERATIONS * PROMPTS * GROUP
    text = logs[0].read_text()
    assert "rank 1 of 2 (local rank 1) joined the gloo group" in text, text[-3000:]
    assert (out / "model").is_dir()
