"""Calibration: a profile the roofline itself produced with known efficiency factors gives
those factors back; a measurement faster than the GPU's peak is capped and said so."""

import pytest

from streamrl.planning.calibration import calibrate, load_assumptions
from streamrl.planning.catalog import load_catalog
from streamrl.planning.profile_record import Profile, ProfileEngine, ProfileHardware, ProfileModel
from streamrl.planning.roofline import AnalyticGenerationCost, Assumptions, analytic_training_cost

CATALOG = load_catalog()
SHAPE = CATALOG.model("qwen2.5-7b")
H20 = CATALOG.gpu("H20")
TRUE = Assumptions(decode_bandwidth_efficiency=0.5, decode_compute_efficiency=0.3, prefill_compute_efficiency=0.45,
                   train_matmul_efficiency=0.25, train_attention_efficiency=0.25)


def _profile_as_the_roofline_sees_it(a: Assumptions) -> Profile:
    gen = AnalyticGenerationCost(SHAPE, H20, 1, 64, a)
    train = analytic_training_cost(SHAPE, H20, 8, 1024, assumptions=a)
    return Profile(
        created="2026-01-01T00:00:00+00:00", hardware=ProfileHardware(device="cuda", name="H20", gpu_type="H20"),
        model=ProfileModel(name=SHAPE.name, num_params=SHAPE.num_params, dtype="bfloat16", shape=SHAPE),
        engine=ProfileEngine(type="torch", max_batch_size=256, device="cuda"),
        ptl=[(b, gen.decode_step_s(b, 16)) for b in (1, 16, 256)], ptl_context=16,
        prefill_s_per_token=gen.prefill_s(100_000) / 100_000, train_micro_batch_size=4, train_sequence_tokens=1024,
        train_world_size=8, forward_backward_s_per_token=train.train_s(1_000_000) / 1e6, optimizer_step_s=0.1,
        publish_s=1.0)


def test_calibrating_on_the_rooflines_own_numbers_gives_its_factors_back():
    fitted, notes = calibrate(_profile_as_the_roofline_sees_it(TRUE), H20)
    assert fitted.decode_bandwidth_efficiency == pytest.approx(0.5, rel=1e-9)  # PTL(1): memory-bound
    assert fitted.decode_compute_efficiency == pytest.approx(0.3, rel=1e-9)  # PTL(256): compute-bound
    assert fitted.prefill_compute_efficiency == pytest.approx(0.45, rel=1e-6)
    assert fitted.train_matmul_efficiency == pytest.approx(0.25, rel=1e-9)
    assert fitted.train_attention_efficiency == fitted.train_matmul_efficiency  # one from a profile's short sequences
    assert fitted.engine_max_batch == Assumptions().engine_max_batch  # what is not measured stays assumed
    assert len(notes) == 4


def test_a_factor_above_one_is_capped_and_named():
    profile = _profile_as_the_roofline_sees_it(TRUE)
    fitted, notes = calibrate(profile, CATALOG.gpu("L4"))  # an H20's numbers read as an L4's: impossible
    assert fitted.decode_bandwidth_efficiency == 1.0
    assert any(n.startswith("decode_bandwidth_efficiency fitted") and "faster than L4's peak" in n for n in notes)


def test_assumptions_files_name_the_bad_field(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("train_matmul_efficiency: 0.5\nkv_bytes_per_value: 1\n")
    assert (load_assumptions(path).train_matmul_efficiency, load_assumptions(path).kv_bytes_per_value) == (0.5, 1.0)
    path.write_text("train_matmul_efficiency: 1.5\ntrain_mfu: 0.1\n")
    with pytest.raises(ValueError, match=r"--assumptions .*a.yaml: train_matmul_efficiency: Input should be less "
                                         r"than or equal.*train_mfu: Extra inputs are not permitted"):
        load_assumptions(path)
