"""The workload a plan is sized for: lengths from a run's lengths.jsonl or lognormal
parameters, and the quantities the planner reads from them."""

import json
import math

import pytest

from streamrl.planning.demand import LengthDistribution


def test_a_runs_lengths_file_gives_every_samples_length_capped(tmp_path):
    path = tmp_path / "lengths.jsonl"
    path.write_text("\n".join(json.dumps({"prompt_id": str(i), "lengths": [10 * i + 1, 10 * i + 2]})
                              for i in range(5)) + "\n")
    workload = LengthDistribution.from_lengths_file(path, prompt_tokens=8, max_length=40)
    assert workload.output_lengths == (1, 2, 11, 12, 21, 22, 31, 32, 40, 40)
    assert workload.mean_output == pytest.approx(21.2)
    assert workload.quantile(0.5) == 21 and workload.max_output == 40
    assert workload.expected_longest(4) == 32  # the 4/5 quantile: the 8th of 10
    assert workload.expected_longest(9) == 40  # the 9/10 quantile
    # P + E[L^2] / (2 E[L])
    assert workload.mean_decode_context == pytest.approx(8 + sum(x * x for x in workload.output_lengths) / (2 * 212))


def test_a_bad_lengths_file_is_named_with_its_line(tmp_path):
    path = tmp_path / "lengths.jsonl"
    path.write_text('{"lengths": [3]}\n{"mean_length": 3}\n')
    with pytest.raises(ValueError, match=r"--lengths .*lengths.jsonl:2: not a lengths.jsonl line"):
        LengthDistribution.from_lengths_file(path, 8)
    with pytest.raises(ValueError, match="cannot read"):
        LengthDistribution.from_lengths_file(tmp_path / "missing.jsonl", 8)


def test_lognormal_lengths_have_the_median_and_cap_asked_for():
    workload = LengthDistribution.lognormal(math.log(1000), 1.0, max_length=8000, prompt_tokens=100)
    assert workload.quantile(0.5) == pytest.approx(1000, rel=0.01)
    assert workload.quantile(0.9) == pytest.approx(1000 * math.exp(1.2816), rel=0.01)
    assert workload.max_output == 8000
    assert LengthDistribution.lognormal(math.log(100), 0.0, 8000, 1).output_lengths == (100,) * 4096
    with pytest.raises(ValueError, match="--lognormal sigma -1: must be >= 0"):
        LengthDistribution.lognormal(1.0, -1, 100, 1)
