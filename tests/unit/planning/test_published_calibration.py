"""The roofline's factors are fitted to published measurements: serving engines
(deploy/catalog/measurements.yaml: decode, prefill and tensor-parallel factors) and training
runs (deploy/catalog/training.yaml: each GPU type's training efficiencies). The shipped
defaults are the serving fit's values; the rows held out of each fit (`use: check`) are
predicted within a median 15% (bench/plan_calibration.py prints every row)."""

import statistics

import pytest

from streamrl.planning.calibration import (
    FITTED_TO_MEASUREMENTS,
    fit_measurements,
    predict_training,
    predicted_over_measured,
)
from streamrl.planning.catalog import load_catalog
from streamrl.planning.roofline import Assumptions
from streamrl.planning.training_fit import fit_efficiency, pretraining_flops

CATALOG = load_catalog()


@pytest.fixture(scope="module")
def fit():
    return fit_measurements(CATALOG.measurements, CATALOG)


def _median_error(ratios):
    return statistics.median(abs(r - 1) for r in ratios)


def test_the_serving_table_covers_engines_gpus_contexts_and_tensor_parallel_sizes():
    rows = CATALOG.measurements
    assert len(rows) >= 30
    assert {r.gpu for r in rows} >= {"A100-80GB", "H100", "H200"}
    assert {r.kind for r in rows} == {"request", "prefill", "throughput"}
    assert {r.tp for r in rows} == {1, 4, 8}
    assert max(r.input_tokens for r in rows if r.kind == "throughput") == 20000
    assert {r.use for r in rows if r.input_tokens + r.output_tokens >= 10000} == {"fit", "check"}
    assert all(r.source and r.quote for r in rows)


def test_the_serving_fit_holds_out_rows_and_predicts_them_within_15_percent(fit):
    assumptions, overhead = fit
    fitted = [predicted_over_measured(r, CATALOG, assumptions, overhead) for r in CATALOG.measurements
              if r.use == "fit"]
    held_out = [predicted_over_measured(r, CATALOG, assumptions) for r in CATALOG.measurements if r.use == "check"]
    assert len(held_out) >= 10
    assert _median_error(fitted) <= 0.10
    assert _median_error(held_out) <= 0.15
    # the uncalibrated factors of before: a compute-bound decode priced 2.7x too cheap
    before = Assumptions(decode_compute_efficiency=0.5, decode_step_overhead_s=0.0015, prefill_compute_efficiency=0.6)
    row = next(r for r in CATALOG.measurements if r.name == "lmdeploy-llama2-7b-a100-b64")
    assert predicted_over_measured(row, CATALOG, before, overhead) > 1.15


def test_the_shipped_defaults_are_the_serving_fit(fit):
    assumptions, _ = fit
    for name in FITTED_TO_MEASUREMENTS:
        assert getattr(Assumptions(), name) == pytest.approx(getattr(assumptions, name), rel=0.05), name


def test_training_efficiencies_are_fitted_per_gpu_type_and_predict_the_held_out_runs():
    a100, h100 = CATALOG.gpu("A100-80GB"), CATALOG.gpu("H100")
    # an A100 reaches more of its (lower) peak than an H100; attention less than the matmuls
    assert a100.train_matmul_efficiency > h100.train_matmul_efficiency > 0.3
    assert a100.train_matmul_efficiency > a100.train_attention_efficiency
    assert a100.train_efficiency_note == "fitted to 12 published runs on A100-80GB (deploy/catalog/training.yaml)"
    # H800 and H200 are H100s for training; a GPU type without rows takes the pooled fit
    assert CATALOG.gpu("H800").train_matmul_efficiency == h100.train_matmul_efficiency
    assert CATALOG.gpu("H800").train_efficiency_note.startswith("H100's (training_like)")
    assert CATALOG.gpu("H20").train_efficiency_note.startswith("no published runs on this type: fitted to all 20")
    held_out = [predict_training(r, CATALOG) / r.tokens_per_s_per_gpu for r in CATALOG.training if r.use == "check"]
    fitted = [predict_training(r, CATALOG) / r.tokens_per_s_per_gpu for r in CATALOG.training if r.use == "fit"]
    assert len(held_out) >= 15 and {r.gpu for r in CATALOG.training} >= {"A100-80GB", "H100"}
    assert _median_error(fitted) <= 0.10
    assert _median_error(held_out) <= 0.15
    # the one assumed 40% of before: a median 24% off, A100 runs 40% too slow, H100's 32K-token run 36% too fast
    before = [predict_training(r, CATALOG, Assumptions(train_matmul_efficiency=0.4)) / r.tokens_per_s_per_gpu
              for r in CATALOG.training]
    assert _median_error(before) > 0.2 and min(before) < 0.6 and max(before) > 1.3


def test_the_efficiency_fit_recovers_known_efficiencies():
    shape = CATALOG.model("mpt-7b")
    peak = 312e12
    points = []
    for seq in (4096, 8192, 32768):
        matmul, attention = pretraining_flops(shape, seq, full_checkpointing=True)
        tokens_per_s = 1 / (matmul / (peak * 0.7) + attention / (peak * 0.3))
        points.append((matmul * tokens_per_s, attention * tokens_per_s, peak))
    assert fit_efficiency(points) == pytest.approx((0.7, 0.3), rel=1e-9)
    # one sequence length cannot tell the two apart: one efficiency for both
    assert fit_efficiency(points[:1])[0] == fit_efficiency(points[:1])[1]


def test_an_efficiency_set_in_the_catalog_or_the_assumptions_wins(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "gpus:\n  - {name: H100, bf16_tflops: 989.4, hbm_gb_s: 3350, memory_gb: 80, interconnect_gb_s: 900, "
        "relative_cost: 1, train_matmul_efficiency: 0.5, train_attention_efficiency: 0.25}\n")
    mine = load_catalog([tmp_path])
    assert (mine.gpu("H100").train_matmul_efficiency, mine.gpu("H100").train_efficiency_note) == (0.5, "as set")
    assert mine.gpu("H800").train_matmul_efficiency == CATALOG.gpu("H800").train_matmul_efficiency  # fitted, not mine
    row = next(r for r in CATALOG.training if r.gpu == "H100" and r.use == "check")
    assert predict_training(row, CATALOG, Assumptions(train_matmul_efficiency=0.2)) < predict_training(row, CATALOG)


@pytest.mark.parametrize("text, message", [
    ("measurements:\n  - {name: x, engine: vllm, gpu: H100, model: llama-3-8b, kind: decode, input_tokens: 1, "
     "seconds: 1, source: s, quote: q}\n", r"measurements\[0\]\.kind: Input should be 'request', 'prefill' or "
                                           r"'throughput'"),
    ("measurements:\n  - {name: x, engine: vllm, gpu: H100, model: llama-3-8b, kind: throughput, input_tokens: 1, "
     "output_tokens: 2, seconds: 1, source: s, quote: q}\n", r"a throughput row gives output_tokens_per_s"),
    ("training:\n  - {name: x, framework: f, gpu: H100, gpus: 8, model: llama-3-8b, sequence_tokens: 4096, "
     "activation_checkpointing: some, tokens_per_s_per_gpu: 1, use: fit, source: s, quote: q}\n",
     r"training\[0\]\.activation_checkpointing: Input should be 'full', 'selective' or 'none'"),
    ("training:\n  - {name: x, framework: f, gpu: H100, gpus: 8, tp: 2, model: llama-3-8b, sequence_tokens: 4096, "
     "activation_checkpointing: none, tokens_per_s_per_gpu: 1, use: fit, source: s, quote: q}\n",
     r"training measurement x: a fit row must be tensor-parallel 1"),
    ("training:\n  - {name: x, framework: f, gpu: H100, gpus: 8, model: gpt-9, sequence_tokens: 4096, "
     "activation_checkpointing: none, tokens_per_s_per_gpu: 1, use: fit, source: s, quote: q}\n",
     r"training measurement x: model 'gpt-9' is not in the catalog"),
])
def test_a_bad_row_is_refused_naming_its_field(tmp_path, text, message):
    (tmp_path / "mine.yaml").write_text(text)
    with pytest.raises(ValueError, match=message):
        load_catalog([tmp_path])
