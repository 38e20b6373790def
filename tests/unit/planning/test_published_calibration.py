"""The roofline's decode and prefill factors are fitted to published measurements of serving
engines at a fixed batch (deploy/catalog/measurements.yaml): the fit reproduces every row
within 15%, and the shipped defaults are that fit's values."""

import pytest

from streamrl.planning.calibration import FITTED_TO_MEASUREMENTS, fit_measurements, predict_measurement
from streamrl.planning.catalog import load_catalog
from streamrl.planning.roofline import Assumptions

CATALOG = load_catalog()


@pytest.fixture(scope="module")
def fit():
    return fit_measurements(CATALOG.measurements, CATALOG)


def test_the_table_covers_engines_gpus_and_model_sizes():
    rows = CATALOG.measurements
    assert len(rows) >= 12
    assert {r.gpu for r in rows} >= {"A100-80GB", "H100", "H200"}
    assert {r.kind for r in rows} == {"request", "prefill"}
    assert {r.tp for r in rows} == {1, 4}
    assert min(r.batch for r in rows if r.kind == "request") == 1 and max(r.batch for r in rows) == 64
    assert all(r.source and r.quote for r in rows)


def test_the_fit_reproduces_every_published_measurement_within_15_percent(fit):
    assumptions, overhead = fit
    errors = {r.name: predict_measurement(r, CATALOG, assumptions, overhead) / r.seconds - 1
              for r in CATALOG.measurements}
    assert max(abs(e) for e in errors.values()) <= 0.15, errors
    # and the uncalibrated factors before it did not: a compute-bound decode was priced 2.7x too cheap
    before = Assumptions(decode_compute_efficiency=0.5, decode_step_overhead_s=0.0015, prefill_compute_efficiency=0.6)
    row = next(r for r in CATALOG.measurements if r.name == "lmdeploy-llama2-7b-a100-b64")
    assert predict_measurement(row, CATALOG, before, overhead) / row.seconds - 1 < -0.15


def test_the_shipped_defaults_are_the_fit(fit):
    assumptions, _ = fit
    for name in FITTED_TO_MEASUREMENTS:
        assert getattr(Assumptions(), name) == pytest.approx(getattr(assumptions, name), rel=0.05), name


def test_a_bad_row_is_refused_naming_its_field(tmp_path):
    (tmp_path / "mine.yaml").write_text("measurements:\n  - {name: x, engine: vllm, gpu: H100, model: llama-3-8b, "
                                        "kind: decode, input_tokens: 1, seconds: 1, source: s, quote: q}\n")
    with pytest.raises(ValueError, match=r"measurements\[0\]\.kind: Input should be 'request' or 'prefill'"):
        load_catalog([tmp_path])
