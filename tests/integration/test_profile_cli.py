"""`streamrl profile` on the built-in tiny model through the command line (a real engine and
learner, a few batch sizes and one timed step), then `streamrl plan` fed that profile: its
table says where the numbers came from and the planned job passes `streamrl validate`."""

import subprocess
import sys

from streamrl.planning.profile import load_profile
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
    assert profile.version == 5 and profile.hardware.cores >= 1
    assert profile.forward_backward_s_per_micro_batch >= 0 and 0 < profile.weight_load_s < 1
    assert 0 < profile.sample_intake_s < profile.sample_stream_s < 0.01  # the wire costs more than nothing
    # serving colocated adds the worker's bookkeeping and the hand-over to the intake
    assert profile.sample_intake_s < profile.sample_colocated_s < 0.01
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


def test_plan_errors_name_the_flag_and_the_problem(write_job):
    job = write_job({})
    done = _cli("plan", job, "--gpus", "H300=8")
    assert done.returncode == 2
    assert "streamrl plan: --gpus 'H300': not in the GPU catalog (known: A100-80GB" in done.stderr
    done = _cli("plan", job, "--gpus", "H100=8", "--model", "qwen2.5-72b", "--lognormal", "6,1")
    assert done.returncode == 2
    assert "budget too small for qwen2.5-72b (72.71 B parameters): the trainer fits nowhere" in done.stderr
    # 72.7 B x 16 B over 24 GPUs is 48.5 GB, plus a 32-sample micro-batch's activations (32 x 608 tokens x
    # 8192 x (2 x 80 + 34) B = 30.9 GB) is more than 72 GB usable; over 32 GPUs it fits.
    assert "at least 32 x H100 would hold it" in done.stderr


def test_plan_prices_the_jobs_own_algorithm_a_ppo_critic_included(write_job):
    grpo, ppo = write_job({}, "grpo.yaml"), write_job({"spec": {"algorithm": {"type": "ppo"}}}, "ppo.yaml")
    args = ("--gpus", "H100=48", "--model", "qwen2.5-72b", "--lognormal", "6,1")
    assert _cli("plan", grpo, *args).returncode == 0  # 32 of them hold the 72B policy (above), 16 generate
    done = _cli("plan", ppo, *args)  # a critic's model state as well: twice the sharded state
    assert done.returncode == 2
    assert "budget too small for qwen2.5-72b (72.71 B parameters): the trainer fits nowhere" in done.stderr
    assert _cli("plan", ppo, *args, "--algorithm", "grpo").returncode == 0  # the flag still overrides
