"""docs/observability.md defines every metric streamrl/metrics.py exports."""

import re
from pathlib import Path

from streamrl import metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


def _metric_names() -> set[str]:
    return {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str) and v.startswith("streamrl_")}


def test_every_metric_is_documented():
    documented = set(re.findall(r"^\| `(streamrl_[a-z0-9_]+)` \|", DOC.read_text(), flags=re.M))
    names = _metric_names()
    assert len(names) >= 35
    assert names - documented == set(), "metrics missing from docs/observability.md"
    assert documented - names == set(), "docs/observability.md lists metrics that do not exist"


def test_every_metric_is_registered_under_its_name():
    """The constants are the names the collectors really use (none is defined but unused)."""
    trainer, generator = metrics.ServiceMetrics("trainer"), metrics.ServiceMetrics("generator")
    ranker, autoscaler = metrics.RankerMetrics(), metrics.AutoscalerMetrics()

    def names(registry) -> set[str]:
        return {m.name.removesuffix("_total") for m in registry.collect()}

    assert _metric_names() == (names(trainer.registry) | names(generator.registry) | names(ranker.registry)
                               | names(autoscaler.registry))
    # Each process exports its own series only, so per-generator averages count generators.
    assert metrics.SKEWNESS_BUBBLE_SECONDS not in names(trainer.registry)
    assert metrics.SAMPLES_ACCEPTED not in names(generator.registry)
    assert metrics.BUSY_SECONDS in names(trainer.registry) & names(generator.registry)
