"""The profile record: written and read back unchanged, bad files refused naming the field, and
the stage costs it gives (PTL interpolated over batch size; training scaled by GPUs)."""

import json

import pytest

from streamrl.planning.costs import GenerationCost, TrainingCost
from streamrl.planning.profile_record import (
    Profile,
    ProfileEngine,
    ProfileHardware,
    ProfileModel,
    load_profile,
    plot_ptl,
)


def _profile(**over) -> Profile:
    fields = dict(
        created="2026-01-01T00:00:00+00:00",
        hardware=ProfileHardware(device="cpu", name="test cpu", gpu_type="H20"),
        model=ProfileModel(name="builtin-tiny", num_params=503424, dtype="float32"),
        engine=ProfileEngine(type="torch", max_batch_size=16, device="cpu"),
        ptl=[(4, 0.004), (1, 0.002), (16, 0.010)], ptl_context=16, prefill_s_per_token=1e-4,
        train_micro_batch_size=8, train_sequence_tokens=64, train_world_size=2,
        forward_backward_s_per_token=2e-4, optimizer_step_s=0.3, publish_s=0.05)
    return Profile(**(fields | over))


def test_a_profile_round_trips_through_its_file(tmp_path):
    profile = _profile()
    profile.write(tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert again == profile
    assert again.ptl == [(1, 0.002), (4, 0.004), (16, 0.010)]  # ascending batch size


def test_generation_cost_interpolates_ptl_over_batch_size_and_ignores_context():
    cost = _profile().generation_cost()
    assert isinstance(cost, GenerationCost)
    assert cost.max_batch == 16
    assert cost.decode_step_s(2, 16) == pytest.approx(0.002 + 0.002 / 3)
    assert cost.decode_step_s(10, 16) == pytest.approx(0.007)
    assert cost.decode_step_s(32, 16) == pytest.approx(0.018)  # beyond: the last segment's slope
    assert cost.decode_step_s(4, 4000) == cost.decode_step_s(4, 16)
    assert cost.prefill_s(1000) == pytest.approx(0.1)
    with_step = _profile(prefill_s_per_step=0.003).generation_cost()
    assert with_step.prefill_s(1000) == pytest.approx(0.103)  # once per admitting step, plus its tokens
    assert with_step.prefill_s(10) == pytest.approx(0.004)


def test_training_cost_scales_with_the_gpus_the_plan_gives_it():
    as_measured = _profile().training_cost()
    assert isinstance(as_measured, TrainingCost)
    assert as_measured.train_s(1000) == pytest.approx(0.2)
    assert (as_measured.step_s(), as_measured.publish_s()) == (0.3, 0.05)
    eight = _profile().training_cost(num_gpus=8)  # measured on 2 ranks
    assert eight.train_s(1000) == pytest.approx(0.05)
    assert eight.step_s() == pytest.approx(0.075)


def test_a_missing_or_bad_profile_is_refused_naming_the_file_and_field(tmp_path):
    with pytest.raises(ValueError, match=r"profile .*none.json: no such file \(write one with `streamrl profile"):
        load_profile(tmp_path / "none.json")
    data = json.loads(_profile().model_dump_json())
    data["ptl"] = [[0, 0.1]]
    del data["publish_s"]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError) as err:
        load_profile(tmp_path / "bad.json")
    assert "bad.json: not a Profile" in str(err.value)
    assert "publish_s" in str(err.value) and "batch size >= 1" in str(err.value)


def test_the_plot_is_a_png(tmp_path):
    path = plot_ptl(_profile(), tmp_path / "ptl.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5000


def test_a_version_1_profile_still_loads_its_unmeasured_costs_as_zero_and_says_so(tmp_path, caplog):
    data = json.loads(_profile().model_dump_json())
    data["version"] = 1
    for key in ("forward_backward_s_per_micro_batch", "weight_load_s", "sample_intake_s", "sample_stream_s"):
        del data[key]
    del data["hardware"]["cores"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = load_profile(tmp_path / "old.json")
    assert (old.forward_backward_s_per_micro_batch, old.weight_load_s, old.sample_stream_s) == (0.0, 0.0, 0.0)
    assert old.hardware.cores == 0
    assert "is version 1: its PTL times the decoder's forward alone" in caplog.text
    for version, says, earlier, unmeasured in [
        (2, "it prices prefill per prompt token alone", "forward alone", "prefill_s_per_step"),
        (3, "it times admissions into an idle engine and samples written", "per prompt token alone", None),
        (4, "it prices a colocated sample at the coordinator's intake alone", "idle engine", "sample_colocated_s"),
        (5, "it measures the stream's two ends in one process", "intake alone", "sample_stream_receive_s"),
    ]:
        caplog.clear()
        data["version"] = version
        (tmp_path / f"v{version}.json").write_text(json.dumps(data))
        loaded = load_profile(tmp_path / f"v{version}.json")
        assert f"is version {version}: {says}" in caplog.text
        assert earlier not in caplog.text  # only what changed since its own version
        if unmeasured:
            assert getattr(loaded, unmeasured) == 0.0
    caplog.clear()
    _profile().write(tmp_path / "new.json")
    load_profile(tmp_path / "new.json")
    assert "version" not in caplog.text


def test_each_end_of_the_stream_costs_what_was_measured_of_it():
    profile = _profile(sample_intake_s=3e-5, sample_stream_s=3e-4, sample_stream_receive_s=1.8e-4)
    assert profile.sample_receive_s() == pytest.approx(1.8e-4)  # the trainer's end, its intake in it
    assert profile.sample_send_s() == pytest.approx(1.2e-4)  # the rest is the replica's
    assert _profile(sample_stream_s=1e-4, sample_stream_receive_s=2e-4).sample_send_s() == 0.0  # noise, not a gain


def test_a_profile_without_the_receiving_end_splits_the_wire_evenly():
    profile = _profile(sample_intake_s=3e-5, sample_stream_s=1e-4)  # before version 6
    assert profile.sample_send_s() == pytest.approx(3.5e-5)
    assert profile.sample_receive_s() == pytest.approx(6.5e-5)
    assert _profile(sample_intake_s=2e-4, sample_stream_s=1e-4).sample_send_s() == 0.0  # noise, not a gain


def test_micro_batches_cost_their_fixed_seconds_scaled_with_the_gpus():
    profile = _profile(forward_backward_s_per_micro_batch=0.01)
    assert profile.training_cost().train_s(1000, 3) == pytest.approx(0.2 + 0.03)
    assert profile.training_cost(num_gpus=8).train_s(1000, 3) == pytest.approx((0.2 + 0.03) / 4)  # measured on 2


def test_a_decode_step_grows_with_context_beyond_the_measured_one():
    cost = _profile(ptl_context_s_per_token=1e-6).generation_cost()
    assert cost.decode_step_s(4, 116) == pytest.approx(0.004 + 4 * 100 * 1e-6)
    assert cost.decode_step_s(4, 8) == pytest.approx(0.004)  # never faster than measured
    assert cost.padded_attention  # the torch engine attends over the longest sequence
    assert not _profile(engine=ProfileEngine(type="vllm", max_batch_size=16, device="cuda")).generation_cost(
        ).padded_attention
