"""A trainer with an in-process generator serves both processes' series as one valid exposition."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streamrl.admin import merged_registry
from streamrl.metrics import ServiceMetrics


def test_merged_exposition_joins_families_and_drops_repeated_series():
    trainer, generator = ServiceMetrics("trainer"), ServiceMetrics("generator")
    trainer.busy_seconds.labels("trainer").inc(3)
    generator.busy_seconds.labels("generator").inc(5)
    generator.generated_tokens.inc(7)
    trainer.policy_version.set(4)
    generator.policy_version.set(4)  # the same unlabelled series in both: served once
    text = generate_latest(merged_registry(trainer.registry, generator.registry)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}  # parses: no duplicate families
    busy = {s.labels["stage"]: s.value for s in families["streamrl_stage_busy_seconds"].samples
            if s.name.endswith("_total")}
    assert busy == {"trainer": 3.0, "generator": 5.0}
    assert [s.value for s in families["streamrl_generated_tokens"].samples if s.name.endswith("_total")] == [7.0]
    assert [s.value for s in families["streamrl_policy_version"].samples] == [4.0]
    assert text.count("# HELP streamrl_stage_busy_seconds_total") == 1
