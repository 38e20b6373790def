"""Observability as code, from one command: the Grafana dashboards (overview, generation
and weights views of an RLJob) and the copy of StreamRL's Prometheus rules the Helm chart
ships (as a PrometheusRule).

    python scripts/gen_observability.py [CHART_FILES_DIR]     # default: helm/streamrl/files

Writes dashboards/<name>.json (import them in Grafana, or let the chart ship them as
ConfigMaps) and prometheus-rules.yaml (= streamrl/prometheus/rules.yaml; Helm can only
read files inside the chart). The committed files must equal a fresh generation (a test
checks), and every query is linted. Metric names and definitions: docs/observability.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grafana_foundation_sdk.builders.common import VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, QueryVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamrl.prometheus import RULES_FILE  # noqa: E402

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
JOB = 'rljob=~"$rljob"'
"""Every query's selector for the chosen RLJob(s)."""


def q(expr: str, legend: str = "__auto") -> Dataquery:
    return Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def series(title: str, unit: str, *targets: Dataquery, description: str = "", min_val: float | None = 0,
           max_val: float | None = None, width: int = 12) -> Timeseries:
    panel = (Timeseries().title(title).description(description).unit(unit).datasource(DATASOURCE).span(width)
             .height(8).legend(VizLegendOptions().display_mode(LegendDisplayMode.LIST)
                               .placement(LegendPlacement.BOTTOM).show_legend(True)))
    if min_val is not None:
        panel = panel.min(min_val)
    if max_val is not None:
        panel = panel.max(max_val)
    for t in targets:
        panel = panel.with_target(t)
    return panel


def stat(title: str, unit: str, target: Dataquery, description: str = "", width: int = 4) -> Stat:
    return (Stat().title(title).description(description).unit(unit).datasource(DATASOURCE).span(width).height(4)
            .with_target(target))


def base(uid: str, title: str, description: str) -> Dashboard:
    return (
        Dashboard(title).uid(uid).description(description).tags(["streamrl", "rl"])
        .refresh("10s").time("now-1h", "now").timezone("browser")
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(QueryVariable("rljob").label("RLJob").datasource(DATASOURCE)
                       .query("label_values(streamrl_iteration, rljob)").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                       .multi(True).include_all(True).all_value(".*"))
    )


def by_rank(aggregation: str, counter: str) -> str:
    """A trainer's per-second rate of `counter` (busy/idle seconds carry no rank) by rank, through
    each rank's streamrl_trainer_rank_info on the same scrape target."""
    return (f'{aggregation} (rate({counter}{{{JOB}, stage="trainer"}}[$__rate_interval])'
            f" * on (instance) group_left (rank) streamrl_trainer_rank_info{{{JOB}}})")


def overview() -> Dashboard:
    return (
        base("streamrl-overview", "StreamRL / Overview",
             "Where the GPUs sit idle and why: progress, throughput, reward, and the two bubbles.")
        .with_row(Row("Progress"))
        .with_panel(stat("Phase", "none", q(f"max by (phase) (streamrl_phase{{{JOB}}}) == 1", "{{phase}}"),
                         "The trainer's run phase."))
        .with_panel(stat("Iterations done", "none", q(f"max(streamrl_iteration{{{JOB}}})")))
        .with_panel(stat("Policy version", "none", q(f'max(streamrl_policy_version{{{JOB}, role="trainer"}})')))
        .with_panel(stat("Samples/s", "none", q(f"sum(streamrl:samples_per_second:rate1m{{{JOB}}})")))
        .with_panel(stat("Pipeline bubble", "percentunit", q(f"max(streamrl:pipeline_bubble_ratio:rate1m{{{JOB}}})"),
                         "Trainer time idle waiting for samples / wall time, last minute."))
        .with_panel(stat("Skewness bubble", "percentunit", q(f"max(streamrl:skewness_bubble_ratio:rate1m{{{JOB}}})"),
                         "Generator time at low batch occupancy with work unfinished / wall time, last minute."))
        .with_row(Row("Throughput and reward"))
        .with_panel(series("Samples/s and tokens/s", "short",
                           q(f"streamrl:samples_per_second:rate1m{{{JOB}}}", "samples/s {{rljob}}"),
                           q(f"streamrl:tokens_per_second:rate1m{{{JOB}}}", "tokens/s {{rljob}}")))
        .with_panel(series("Reward (mean of the last iteration)", "none",
                           q(f"streamrl_reward_mean{{{JOB}}}", "{{rljob}}"), min_val=None))
        .with_row(Row("Bubbles"))
        .with_panel(series("Bubble ratios", "percentunit",
                           q(f"streamrl:pipeline_bubble_ratio:rate1m{{{JOB}}}", "pipeline {{rljob}}"),
                           q(f"streamrl:skewness_bubble_ratio:rate1m{{{JOB}}}", "skewness {{rljob}}"),
                           description="Pipeline: trainer waiting for samples. Skewness: generators decoding a "
                                       "few long samples at low occupancy.", max_val=1))
        .with_panel(series("Stage utilisation", "percentunit",
                           q(f"streamrl:stage_utilisation:rate1m{{{JOB}}}", "{{stage}} {{rljob}}"), max_val=1))
        .with_row(Row("Balance between stages"))
        .with_panel(series("Generation vs training time per iteration", "s",
                           q(f"streamrl_iteration_generation_seconds{{{JOB}}}", "generation {{rljob}}"),
                           q(f"streamrl_iteration_train_seconds{{{JOB}}}", "training {{rljob}}"),
                           q(f"streamrl:stage_imbalance_seconds{{{JOB}}}", "imbalance {{rljob}}"),
                           description="Imbalance = generation - training: above zero the run is generation-bound.",
                           min_val=None))
        .with_row(Row("Trainer ranks"))
        .with_panel(series("Trainer ranks: busy vs waiting", "percentunit",
                           q(by_rank("sum by (rljob, rank)", "streamrl_stage_busy_seconds_total"),
                             "busy rank {{rank}}"),
                           q(by_rank("sum by (rljob, rank, reason)", "streamrl_stage_idle_seconds_total"),
                             "{{reason}} rank {{rank}}"),
                           description="Each rank's time working or idle, by reason: rank 0 waits for samples, the "
                                       "others for rank 0's next command (waiting_leader).", max_val=1))
        .with_panel(series("Trainer ranks: forward/backward and collective seconds per second", "percentunit",
                           q(f"sum by (rljob, rank) (rate(streamrl_trainer_forward_backward_seconds_sum{{{JOB}}}"
                             f"[$__rate_interval]))", "forward/backward rank {{rank}}"),
                           q(f"sum by (rljob, rank, kind) (rate(streamrl_trainer_collective_seconds_total{{{JOB}}}"
                             f"[$__rate_interval]))", "{{kind}} rank {{rank}}"),
                           description="Forward/backward includes FSDP2's backward re-gathers and reduce-scatters; "
                                       "a collective's seconds include waiting for the slowest rank to join it."))
        .with_row(Row("Scaling"))
        .with_panel(series("Generator replicas per pool: desired vs connected", "none",
                           q(f"streamrl:generator_replicas_desired{{{JOB}}}", "desired {{pool}} {{rljob}}"),
                           q(f"streamrl:generator_replicas_connected{{{JOB}}}", "connected {{pool}} {{rljob}}"),
                           description="Desired: what the autoscaler asks for (Internal mode). Connected: replicas "
                                       "the trainer is streaming from. A lasting gap means replicas cannot start."))
        .with_panel(series("Scaling decisions (replicas added or removed per 5 minutes)", "none",
                           q(f"sum by (rljob, pool, direction) "
                             f"(increase(streamrl_autoscaler_decisions_total{{{JOB}}}[5m]))",
                             "{{direction}} {{pool}} {{rljob}}"),
                           q(f"max by (rljob) (streamrl_autoscaler_trainer_bound{{{JOB}}})", "trainer-bound {{rljob}}"),
                           description="Each decision's reason is in the RLJob's status.autoscaling and its Events "
                                       "(locally: autoscaling.jsonl)."))
    )


def generation() -> Dashboard:
    # Generator-only series need no role selector: only generators export them (in-process too).
    stage = f'{JOB}, stage="generator"'
    return (
        base("streamrl-generation", "StreamRL / Generation",
             "Per-replica occupancy, throughput and queues; the long tail and how well the ranker predicts it.")
        .with_row(Row("Replicas"))
        .with_panel(series("Batch occupancy", "percentunit", q(f"streamrl_batch_occupancy{{{JOB}}}", "{{replica}}"),
                           description="Running sequences / batch cap.", max_val=1))
        .with_panel(series("Tokens/s per replica", "short",
                           q(f"rate(streamrl_generated_tokens_total{{{JOB}}}[$__rate_interval])", "{{replica}}")))
        .with_panel(series("Queue depth", "none",
                           q(f"streamrl_engine_waiting_sequences{{{JOB}}}", "waiting {{replica}}"),
                           q(f"streamrl_engine_running_sequences{{{JOB}}}", "running {{replica}}")))
        .with_panel(series("Skewness bubble per replica", "percentunit",
                           q(f"rate(streamrl_skewness_bubble_seconds_total{{{JOB}}}[$__rate_interval])",
                             "{{replica}}"), max_val=1))
        .with_panel(series("Generator time by state", "percentunit",
                           q(f"sum by (reason) (rate(streamrl_stage_idle_seconds_total{{{stage}}}[$__rate_interval]))"
                             f" / scalar(count(streamrl_stage_busy_seconds_total{{{stage}}}))", "idle: {{reason}}"),
                           q(f"sum(rate(streamrl_stage_busy_seconds_total{{{stage}}}[$__rate_interval]))"
                             f" / scalar(count(streamrl_stage_busy_seconds_total{{{stage}}}))", "busy"),
                           max_val=1))
        .with_row(Row("The long tail"))
        .with_panel(series("Output length quantiles", "none", *[
            q(f"histogram_quantile({p}, sum by (le) (rate(streamrl_output_length_tokens_bucket{{{JOB}}}"
              f"[$__rate_interval])))", f"p{round(p * 100)}") for p in (0.5, 0.9, 0.99)]))
        .with_panel(series("Predicted vs actual mean length", "none",
                           q(f"streamrl_predicted_length_mean{{{JOB}}}", "predicted {{rljob}}"),
                           q(f"streamrl_actual_length_mean{{{JOB}}}", "actual {{rljob}}")))
        .with_panel(series("Ranker recall of the true top-x% longest", "percentunit",
                           q(f"streamrl_ranker_recall{{{JOB}}}", "top {{top}}"), max_val=1))
    )


def weights() -> Dashboard:
    def p90(metric: str, by: str = "") -> str:
        return (f"histogram_quantile(0.9, sum by (le{', ' + by if by else ''}) "
                f"(rate({metric}_bucket{{{JOB}}}[$__rate_interval])))")

    return (
        base("streamrl-weights", "StreamRL / Weights",
             "How fast new weight versions reach the generators, from where, and how stale the samples are.")
        .with_row(Row("Versions"))
        .with_panel(series("Policy version in use", "none",
                           q(f"streamrl_policy_version{{{JOB}}}", "{{role}} {{replica}}")))
        .with_panel(series("Weight sync seconds (p90)", "s",
                           q(p90("streamrl_weight_sync_seconds"), "notice to swap"),
                           q(p90("streamrl_weight_fetch_seconds", "source"), "fetch from {{source}}"),
                           q(p90("streamrl_weight_publish_seconds"), "publish (trainer)")))
        .with_panel(series("Weight bytes/s", "Bps",
                           q(f"sum by (source) (rate(streamrl_weight_sync_bytes_total{{{JOB}}}[$__rate_interval]))",
                             "received from {{source}}"),
                           q(f"sum by (role) (rate(streamrl_weight_served_bytes_total{{{JOB}}}[$__rate_interval]))",
                             "served by {{role}}")))
        .with_row(Row("Staleness"))
        .with_panel(series("Sample staleness (versions)", "none",
                           q(f"histogram_quantile(0.99, sum by (le) (rate(streamrl_sample_staleness_bucket{{{JOB}}}"
                             f"[$__rate_interval])))", "p99"),
                           q(f"streamrl_sample_staleness_max{{{JOB}}}", "max, last iteration"),
                           q(f"streamrl_max_staleness{{{JOB}}}", "contract (maxStaleness)")))
        .with_panel(series("Samples dropped or re-issued per second", "short",
                           q(f"rate(streamrl_samples_stale_dropped_total{{{JOB}}}[$__rate_interval])", "stale"),
                           q(f"rate(streamrl_samples_redispatched_total{{{JOB}}}[$__rate_interval])",
                             "re-dispatched")))
        .with_row(Row("Train/inference mismatch"))
        .with_panel(series("Engine vs learner log-probabilities (per token, last iteration)", "none",
                           q(f"streamrl_mismatch_abs_logprob{{{JOB}}}", "mean |log p - log q|"),
                           q(f"streamrl_mismatch_kl{{{JOB}}}", "KL(engine || learner), k3")))
        .with_panel(series("Largest token probability ratio, and tokens capped", "none",
                           q(f"streamrl_mismatch_ratio_max{{{JOB}}}", "max ratio (either way)"),
                           q(f"streamrl_importance_capped_fraction{{{JOB}}}", "fraction capped (importanceSampling)")))
    )


DASHBOARDS = {"overview": overview, "generation": generation, "weights": weights}


def _number(dashboard):
    """Stable panel ids (1, 2, ...) and query refIds (A, B, ...), so regeneration is byte-identical."""
    for i, panel in enumerate(dashboard.panels, 1):
        panel.id_val = i
        for j, target in enumerate(getattr(panel, "targets", None) or []):
            target.ref_id = chr(ord("A") + j)
    return dashboard


def render() -> dict[str, str]:
    """{file name: JSON text} of every dashboard."""
    encoder = JSONEncoder(sort_keys=True, indent=2)
    return {f"{name}.json": encoder.encode(_number(build().build())) + "\n" for name, build in DASHBOARDS.items()}


def rules_copy() -> str:
    """streamrl/prometheus/rules.yaml, for the chart's PrometheusRule template."""
    return ("# Generated by scripts/gen_observability.py: a copy of streamrl/prometheus/rules.yaml; do not edit.\n"
            + RULES_FILE.read_text())


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "helm" / "streamrl" / "files"
    files = {Path("dashboards") / name: text for name, text in render().items()}
    files[Path("prometheus-rules.yaml")] = rules_copy()
    for rel, text in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
        print(f"wrote {out / rel}")


if __name__ == "__main__":
    main()
