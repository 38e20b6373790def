"""`streamrl profile` on the built-in tiny model through the command line (a real engine and
learner, a few batch sizes and one timed step; the torch engine, and vLLM's CPU build), then
`streamrl plan` fed that profile: its table says where the numbers came from and the planned
job passes `streamrl validate`."""

import subprocess
import sys

import pytest
import yaml

from streamrl.planning.profile_record import load_profile
from tests.conftest import child_env


def _cli(*args, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamrl.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=child_env())


def test_profile_writes_the_record_and_plot_and_plan_uses_it(tmp_path, write_job):
    job = write_job({"spec": {"algorithm": {"maxNewTokens": 48, "microBatchSize": 4, "groupSize": 4,
                                            "promptsPerStep": 8}}})
    out = tmp_path / "profile" / "tiny.json"
    done = _cli("profile", job, "--out", out, "--gpu-type", "l4", "--batch-sizes", "1,2,4", "--steps", "2",
                "--train-steps", "1", "--prompt-tokens", "16")
    assert done.returncode == 0, done.stderr[-3000:]
    profile = load_profile(out)
    assert [b for b, _ in profile.ptl] == [1, 2, 4]
    assert all(0 < s < 1 for _, s in profile.ptl)
    assert profile.hardware.gpu_type == "L4" and profile.hardware.device == "cpu"
    assert profile.model.name == "builtin-tiny" and profile.model.num_params == 503424
    assert profile.model.shape.num_params == 503424  # the shape model counts the parameters torch does
    assert profile.engine.max_batch_size == 64  # the example pool's maxBatchSize
    assert profile.train_micro_batch_size == 4 and profile.train_sequence_tokens == 16 + 48
    assert 0 < profile.prefill_s_per_token < 0.01 and 0 < profile.forward_backward_s_per_token < 0.01
    assert 0 < profile.prefill_s_per_step < 0.05
    assert profile.optimizer_step_s > 0 and profile.publish_s > 0
    assert profile.version == 6 and profile.hardware.cores >= 1
    assert profile.forward_backward_s_per_micro_batch >= 0 and 0 < profile.weight_load_s < 1
    assert 0 < profile.sample_intake_s < profile.sample_stream_s < 0.01  # the wire costs more than nothing
    # each end measured in a process of its own: the trainer's takes in more than its intake, the
    # replica's sends for more than nothing, and together they are the stream
    assert profile.sample_intake_s < profile.sample_stream_receive_s < profile.sample_stream_s
    assert profile.sample_send_s() == pytest.approx(profile.sample_stream_s - profile.sample_stream_receive_s)
    assert "receiving" in done.stdout and "sending" in done.stdout
    # serving colocated adds the worker's bookkeeping and the hand-over to the intake
    assert profile.sample_intake_s < profile.sample_colocated_s < 0.01
    assert 0 < profile.cache_release_s < 0.01 and 0 < profile.cache_allocate_s < 0.1  # colocated's switches
    assert (out.with_suffix(".png")).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"profile: {out}" in done.stdout

    planned = tmp_path / "planned.yaml"
    done = _cli("plan", job, "--gpus", "L4=4", "--profile", out, "--lognormal", "3,0.5", "--prompt-tokens", "16",
                "--out", planned)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(("generation", "training"))]
    assert [r[0] for r in rows] == ["generation", "training"]
    assert all(r[2] == "L4" and r[-2:] == ["profile", str(out)] for r in rows)
    assert sum(int(r[3]) for r in rows) <= 4
    checked = _cli("validate", planned)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_profile_measures_a_vllm_pool_and_plan_takes_it(tmp_path, write_job):
    engine = {"type": "vllm", "device": "cpu", "enforceEager": True, "maxNumSeqs": 8, "cpuKvCacheGib": 0.25}
    job = write_job({"spec": {"algorithm": {"maxNewTokens": 32, "microBatchSize": 4, "groupSize": 4,
                                            "promptsPerStep": 4},
                              "generators": {"pools": [{"name": "default", "replicas": 1, "engine": engine}]}}})
    out = tmp_path / "vllm.json"
    done = _cli("profile", job, "--out", out, "--gpu-type", "l4", "--batch-sizes", "1,4", "--steps", "2",
                "--train-steps", "1", "--prompt-tokens", "16", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    profile = load_profile(out)
    assert (profile.engine.type, profile.engine.device, profile.engine.max_batch_size) == ("vllm", "cpu", 8)
    assert [b for b, _ in profile.ptl] == [1, 4] and all(0 < s < 1 for _, s in profile.ptl)
    assert profile.model.num_params == 503424 and profile.ptl_long_context == 16 + 32
    assert 0 < profile.weight_load_s < 5  # the policy's weights, loaded in place into vLLM
    assert 0 < profile.prefill_s_per_token < 0.01 and profile.sample_colocated_s > 0
    assert not profile.generation_cost().padded_attention  # vLLM attends each sequence over its own context

    done = _cli("plan", job, "--gpus", "L4=4", "--profile", out, "--lognormal", "3,0.5", "--prompt-tokens", "16")
    assert done.returncode == 0, done.stderr[-3000:]
    generation = next(line.split() for line in done.stdout.splitlines() if line.startswith("generation"))
    assert generation[2] == "L4" and generation[-2:] == ["profile", str(out)]


def test_plan_errors_name_the_flag_and_the_problem(write_job):
    job = write_job({})
    done = _cli("plan", job, "--gpus", "H300=8")
    assert done.returncode == 2
    assert "streamrl plan: --gpus 'H300': not in the GPU catalog (known: A100-80GB" in done.stderr
    done = _cli("plan", job, "--gpus", "H100=1", "--model", "qwen2.5-7b", "--lognormal", "6,1")
    assert done.returncode == 2
    assert "budget too small for qwen2.5-7b (7.62 B parameters): the trainer fits nowhere" in done.stderr
    # 7.6 B x 16 B is 122 GB on one GPU (131.4 GB with two layers unsharded and the activations), and CPU
    # offload needs the state sharded over 2 ranks or more. Over 2 H100 with activation checkpointing, 61 GB
    # of state and 3.3 GB of layers leave room for the 32-sample micro-batch's activations (32 x 608 tokens x
    # 3584 x (2 x 28 + 34) B = 6.3 GB).
    assert "qwen2.5-7b on 1 x H100 with activation checkpointing needs 131.4 GB per GPU" in done.stderr
    assert "at least 2 x H100 would hold it" in done.stderr


def test_plan_prices_the_jobs_own_algorithm_a_ppo_critic_included(write_job):
    grpo, ppo = write_job({}, "grpo.yaml"), write_job({"spec": {"algorithm": {"type": "ppo"}}}, "ppo.yaml")
    args = ("--gpus", "H100=16", "--model", "qwen2.5-72b", "--lognormal", "6,1")
    # The 72B policy's 1.16 TB of state fits 8 H100 offloaded (145 GB of host memory each), beside 8 generating.
    assert _cli("plan", grpo, *args).returncode == 0
    done = _cli("plan", ppo, *args)  # a critic's state as well: 291 GB of host memory per GPU, 230 usable
    assert done.returncode == 2
    assert "budget too small for qwen2.5-72b (72.71 B parameters): no split of dc: 16 x H100" in done.stderr
    assert _cli("plan", ppo, *args, "--algorithm", "grpo").returncode == 0  # the flag still overrides


def test_a_72b_ppo_job_on_48_h800_plans_with_the_memory_features_it_needs(write_job, tmp_path):
    # The paper's setup: PPO with actor, critic and reference, global batch 1024, outputs up to 20K tokens.
    job = write_job({"spec": {"algorithm": {"type": "ppo", "klCoef": 0.001, "maxNewTokens": 20480,
                                            "promptsPerStep": 128, "groupSize": 8, "microBatchSize": 1}}})
    planned = tmp_path / "planned.yaml"
    done = _cli("plan", job, "--gpus", "H800=48", "--model", "qwen2.5-72b", "--lognormal", "7.6,1", "--out", planned)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()
            if line.startswith(("generation", "training"))}
    assert int(rows["generation"][3]) + int(rows["training"][3]) <= 48
    memory = next(line for line in done.stdout.splitlines() if line.startswith("trainer memory:"))
    assert memory.startswith("trainer memory: activation checkpointing, CPU offload (without them: training "
                             f"qwen2.5-72b on {rows['training'][3]} x H800 needs")
    written = yaml.safe_load(planned.read_text())["spec"]["trainer"]
    assert written["memory"] == {"activationCheckpointing": True, "cpuOffload": True}
    checked = _cli("validate", planned)
    assert checked.returncode == 0, checked.stdout + checked.stderr
