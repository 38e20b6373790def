"""The run report: PNG plots a person would rather look at than read, and a short Markdown
summary beside them, from a run directory: the trainer's `metrics.jsonl` and `summary.json`,
`streamrl run`'s `run.json`, `autoscaling.jsonl`, `timeline/` and `events.jsonl` (deaths, restarts,
resumes, checkpoints, scaling: marked on the timeline and the progress plot, listed in report.md),
each read through its record class.

Written at the end of `streamrl run` and by `streamrl report DIR` for any run directory.
The plotting functions return their figures so tests can compare what is drawn with
`metrics.jsonl`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from streamrl.metrics import (  # noqa: E402
    LOW_OCCUPANCY,
    NO_WORK,
    WAITING_GENERATORS,
    WAITING_LEADER,
    WAITING_SAMPLES,
    WAITING_WEIGHTS,
)
from streamrl.records import (  # noqa: E402
    EVENTS_FILE,
    LOCAL_RUN_FILE,
    METRICS_FILE,
    SCALING_FILE,
    SUMMARY_FILE,
    IterationRecord,
    LocalRun,
    RunEvent,
    RunSummary,
    ScalingRecord,
)
from streamrl.timeline import read_spans  # noqa: E402

STATES = {  # (state, reason) -> (colour, legend)
    ("busy", ""): ("#2b8cbe", "working (training / generating)"),
    ("busy", LOW_OCCUPANCY): ("#fdae61", "generating at low occupancy (skewness bubble)"),
    ("idle", WAITING_SAMPLES): ("#d7191c", "trainer waiting for samples (pipeline bubble)"),
    ("idle", WAITING_WEIGHTS): ("#9e9ac8", "waiting for weights"),
    ("idle", NO_WORK): ("#e0e0e0", "idle: no work"),
    ("idle", WAITING_GENERATORS): ("#bdbdbd", "waiting for generators to join"),
    ("idle", WAITING_LEADER): ("#74c476", "trainer rank waiting for rank 0's next command"),
}
EVENT_MARKERS = {  # RunEvent.kind -> (marker, colour, legend)
    "died": ("X", "#d7191c", "died"),
    "restarted": ("^", "#ff7f00", "restarted"),
    "backoff": ("x", "#d7191c", "died before serving: its replacement backs off"),
    "replaced": ("v", "#ff7f00", "replaced by another replica"),
    "resumed": (">", "#1a9641", "resumed from a checkpoint"),
    "checkpoint": ("d", "#08519c", "checkpoint saved"),
    "preempted": ("s", "#6a3d9a", "preempted (SIGTERM, checkpointed)"),
    "scaled": ("P", "#525252", "autoscaler added / removed it"),
}
OTHER_EVENT = ("o", "#000000")
"""An event kind this reader does not know (a newer writer's): drawn, labelled by its kind."""
TRAINER_RANK = re.compile(r"trainer(?:-rank-(\d+))?")
"""A trainer rank's timeline: rank 0's is `trainer`, rank N's `trainer-rank-N`."""


@dataclass
class Run:
    directory: Path
    name: str
    """The RLJob's name (the directory's when job.yaml is missing)."""
    records: list[IterationRecord]
    summary: RunSummary | None = None
    """The trainer's summary.json (None: the trainer did not get to write it)."""
    local: LocalRun | None = None
    """`streamrl run`'s run.json (None: the services were started some other way)."""
    timelines: dict[str, list[dict]] = field(default_factory=dict)
    """{process name: spans}, the trainer's ranks first (by rank), then the others by name."""
    scaling: list[ScalingRecord] = field(default_factory=list)
    """The autoscaler's changes (autoscaling.jsonl lines with a step), in order."""
    events: list[RunEvent] = field(default_factory=list)
    """What happened to the processes (events.jsonl), by time."""

    @property
    def start_unix(self) -> float:
        """When the run started: the first record's time less its elapsed seconds."""
        return self.records[0].time_unix - self.records[0].elapsed_s

    def rows(self) -> list[str]:
        """The timeline's rows: every process with spans in their order, and any an event names
        without them (one that died before writing any) sorted in among them."""
        missing = [p for p in dict.fromkeys(e.process for e in self.events) if p not in self.timelines]
        return sorted([*self.timelines, *missing], key=_row_order) if missing else list(self.timelines)


def load_run(directory: str | Path) -> Run:
    """Everything a run directory holds, read through the record classes (ValueError naming
    the file and the field when one is not what it should be)."""
    directory = Path(directory)
    metrics = directory / METRICS_FILE
    if not metrics.is_file():
        raise ValueError(f"{directory}: no {METRICS_FILE} here; is it a run directory (streamrl run --out)?")
    records = IterationRecord.read_lines(metrics)
    if not records:
        raise ValueError(f"{metrics}: no iterations recorded yet")
    name = directory.name
    try:
        import yaml

        name = yaml.safe_load((directory / "job.yaml").read_text())["metadata"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    summary = RunSummary.read(directory / SUMMARY_FILE) if (directory / SUMMARY_FILE).is_file() else None
    local = LocalRun.read(directory / LOCAL_RUN_FILE) if (directory / LOCAL_RUN_FILE).is_file() else None
    scaling = [r for r in ScalingRecord.read_lines(directory / SCALING_FILE) if r.step] \
        if (directory / SCALING_FILE).is_file() else []
    timelines = {}
    for path in sorted((directory / "timeline").glob("*.jsonl"), key=lambda p: _row_order(p.stem)):
        if spans := read_spans(path):
            timelines[path.stem] = spans
    events = sorted(RunEvent.read_lines(directory / EVENTS_FILE), key=lambda e: e.time_unix) \
        if (directory / EVENTS_FILE).is_file() else []
    return Run(directory, name, records, summary, local, timelines, scaling, events)


def _row_order(name: str) -> tuple:
    """Trainer ranks by rank, then the others by name, numbers as numbers (gen-10 after gen-9)."""
    rank = trainer_rank(name)
    if rank is not None:
        return (0, rank, ())
    return (1, 0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p))


def trainer_rank(name: str) -> int | None:
    """The rank of a trainer rank's timeline name (None: another process's)."""
    match = TRAINER_RANK.fullmatch(name)
    return int(match.group(1) or 0) if match else None


@dataclass(frozen=True)
class RankTime:
    """One trainer rank's seconds, from its timeline."""

    rank: int
    busy_s: float
    idle_s: dict[str, float]
    """Seconds idle, by reason."""


def rank_times(run: Run) -> list[RankTime]:
    """Every trainer rank with a timeline, by rank (a rank whose file is missing is not here)."""
    out = []
    for name, spans in run.timelines.items():
        rank = trainer_rank(name)
        if rank is None:
            continue
        idle: dict[str, float] = {}
        for s in spans:
            if s["state"] == "idle":
                idle[s["reason"]] = idle.get(s["reason"], 0.0) + s["end"] - s["start"]
        out.append(RankTime(rank, sum(s["end"] - s["start"] for s in spans if s["state"] == "busy"), idle))
    return out


def iteration_at(run: Run, time_unix: float) -> float:
    """Where a moment falls on the iteration axis: iteration i ends at its record's time, so a
    moment during it lies between i - 1 and i (before the run: its first; after: its last)."""
    first = run.records[0]
    times = [run.start_unix, *(r.time_unix for r in run.records)]
    return float(np.interp(time_unix, times, [first.iteration - 1, *(r.iteration for r in run.records)]))


def _event_style(kind: str) -> tuple[str, str, str]:
    """(marker, colour, legend) of an event kind."""
    return EVENT_MARKERS.get(kind, (*OTHER_EVENT, kind))


def _event_handles(kinds: list[str], lines: bool = False) -> list[Line2D]:
    """Legend entries: each kind's marker (the timeline) or its vertical line (the progress plot)."""
    if lines:
        return [Line2D([], [], color=_event_style(k)[1], ls=_event_dashes(k), label=_event_style(k)[2]) for k in kinds]
    return [Line2D([], [], marker=_event_style(k)[0], color=_event_style(k)[1], linestyle="none",
                   markeredgecolor="white", markersize=9, label=_event_style(k)[2]) for k in kinds]


def _event_dashes(kind: str) -> str:
    return ":" if kind == "checkpoint" else "--"  # checkpoints are routine, the others are not


def _kinds(events: list[RunEvent]) -> list[str]:
    """The kinds present, known ones in EVENT_MARKERS's order."""
    seen = dict.fromkeys(e.kind for e in events)
    return [k for k in EVENT_MARKERS if k in seen] + [k for k in seen if k not in EVENT_MARKERS]


def plot_progress(run: Run) -> Figure:
    """Reward and samples/s per iteration; a vertical line (gid `event:<kind>:<process>`)
    where each event of events.jsonl happened, coloured by kind."""
    it = [r.iteration for r in run.records]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax1.plot(it, [r.reward_mean for r in run.records], marker="o", ms=3, color="#1a9641", label="reward")
    ax1.set_ylabel("mean reward")
    ax1.set_title(f"{run.name}: reward and throughput per iteration")
    ax1.grid(alpha=0.3)
    ax2.plot(it, [r.samples_per_s for r in run.records], marker="o", ms=3, color="#2b8cbe", label="samples/s")
    ax2.set_ylabel("samples/s")
    ax2.set_xlabel("iteration")
    ax2.grid(alpha=0.3)
    for e in run.events:
        x, (_, colour, _) = iteration_at(run, e.time_unix), _event_style(e.kind)
        for ax in (ax1, ax2):
            ax.axvline(x, color=colour, lw=1.0, alpha=0.7, ls=_event_dashes(e.kind), gid=f"event:{e.kind}:{e.process}")
    if run.events:
        ax1.legend(handles=[*ax1.get_lines()[:1], *_event_handles(_kinds(run.events), lines=True)],
                   loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def plot_bubbles(run: Run) -> Figure:
    """Pipeline- and skewness-bubble ratios per iteration."""
    it = [r.iteration for r in run.records]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(it, [r.pipeline_bubble_ratio for r in run.records], marker="o", ms=3, color="#d7191c",
            label="pipeline bubble (trainer waiting for samples)")
    ax.plot(it, [r.skewness_bubble_ratio for r in run.records], marker="s", ms=3, color="#fdae61",
            label="skewness bubble (generators at low occupancy)")
    ax.set_ylim(0, 1)
    ax.set_xlabel("iteration")
    ax.set_ylabel("fraction of wall time")
    ax.set_title("Bubble ratios per iteration")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def plot_timeline(run: Run) -> Figure:
    """A Gantt chart: one row per process (also one that died), a bar per stretch of busy or
    idle time, coloured by reason; the gaps the paper draws as bubbles are the red and orange
    stretches. Each event is a marker on its process's row at its time (one Line2D per kind,
    gid `event:<kind>`)."""
    names = run.rows()
    fig, ax = plt.subplots(figsize=(14, 1.6 + 0.5 * max(1, len(names))))
    t0 = min([*(s["start"] for spans in run.timelines.values() for s in spans), *(e.time_unix for e in run.events)],
             default=0.0)
    for row, name in enumerate(names):
        by_state: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for s in run.timelines.get(name, []):
            by_state.setdefault((s["state"], s["reason"]), []).append((s["start"] - t0, s["end"] - s["start"]))
        for state, bars in by_state.items():
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=STATES.get(state, ("#000000",))[0],
                           label=f"{name}|{state}")
    # Iteration boundaries from the trainer's records.
    for r in run.records:
        ax.axvline(r.time_unix - t0, color="#636363", lw=0.4, alpha=0.5)
    row_of = {name: row for row, name in enumerate(names)}
    for kind in _kinds(run.events):
        marker, colour, _ = _event_style(kind)
        these = [e for e in run.events if e.kind == kind]
        ax.plot([e.time_unix - t0 for e in these], [row_of[e.process] for e in these], marker=marker,
                color=colour, markeredgecolor="white", markersize=10, linestyle="none", zorder=5,
                gid=f"event:{kind}")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first process started (grey lines: iteration ends)")
    ax.set_title("Activity per process")
    seen = {tuple(s) for spans in run.timelines.values() for s in ((x["state"], x["reason"]) for x in spans)}
    ax.legend(handles=[*(Patch(color=color, label=label) for k, (color, label) in STATES.items() if k in seen),
                       *_event_handles(_kinds(run.events))],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def summary_markdown(run: Run, images: list[str]) -> str:
    """The trainer's summary.json and `streamrl run`'s run.json, merged into one table."""
    rs, s, local = run.records, run.summary, run.local
    gen, train = _mean([r.generation_s for r in rs]), _mean([r.train_s for r in rs])
    lines = [
        f"# Run report: {run.name}",
        "",
        f"Run directory: `{run.directory}`",
        "",
        "| | |",
        "| --- | --- |",
        f"| phase | {s.phase.value if s else 'unknown (no summary.json)'} |",
        f"| mode | {s.mode if s else 'unknown'} |",
        f"| iterations | {len(rs)} |",
        f"| samples | {sum(r.num_samples for r in rs)} |",
        f"| samples/s | {s.samples_per_s if s else _mean([r.samples_per_s for r in rs]):.1f} |",
        f"| reward, first → last iteration | {rs[0].reward_mean:.3f} → {rs[-1].reward_mean:.3f} |",
        f"| pipeline-bubble ratio (wall-weighted) | {_weighted(rs, 'pipeline_bubble_ratio'):.3f} |",
        f"| skewness-bubble ratio (wall-weighted) | {_weighted(rs, 'skewness_bubble_ratio'):.3f} |",
        f"| generation vs training s/iteration | {gen:.3f} vs {train:.3f} "
        f"({'generation' if gen > train else 'training'}-bound) |",
        f"| staleness, max | {max(r.staleness_max for r in rs)} |",
        f"| stale samples dropped | {s.num_samples_stale_dropped if s else rs[-1].num_samples_stale_dropped} |",
    ]
    if local is not None:
        lines.append(f"| generator replica-seconds | {local.generator_replica_seconds:.1f} "
                     f"({local.generator_replicas_started} replicas started) |")
        if local.autoscaling is not None:
            a = local.autoscaling
            lines.append(f"| autoscaling | {a.scale_ups} up, {a.scale_downs} down; final "
                         f"{', '.join(f'{k}={v}' for k, v in a.replicas_final.items())} |")
        if local.failure:
            lines.append(f"| run failed | {_cell(local.failure)} |")
    if run.events:
        counts = {k: sum(e.kind == k for e in run.events) for k in _kinds(run.events)}
        lines.append(f"| process events | {', '.join(f'{k} {n}' for k, n in counts.items())} |")
    lines.append("")
    ranks = rank_times(run)
    if len(ranks) > 1:
        lines += ["## Trainer ranks", "", "| rank | busy s | idle s | idle by reason |", "| --- | --- | --- | --- |"]
        lines += [f"| {r.rank} | {r.busy_s:.1f} | {sum(r.idle_s.values()):.1f} | "
                  f"{', '.join(f'{k} {v:.1f}' for k, v in sorted(r.idle_s.items()))} |" for r in ranks]
        lines.append("")
    start = run.start_unix
    if run.events:
        lines += ["## Events", "", "| t (s) | kind | process | detail |", "| --- | --- | --- | --- |"]
        lines += [f"| {e.time_unix - start:.1f} | {e.kind} | {e.process} | {_cell(e.detail)} |" for e in run.events]
        lines.append("")
    if run.scaling:
        lines += ["## Autoscaling", "", "| t (s) | change | replicas | why |", "| --- | --- | --- | --- |"]
        lines += [f"| {r.time_unix - start:.1f} | {r.step:+d} {r.pool or ''} | "
                  f"{', '.join(f'{k}={v}' for k, v in r.replicas.items())} | {r.reason} |" for r in run.scaling]
        lines.append("")
    lines += [f"![{Path(i).stem}]({i})" for i in images]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text for one Markdown table cell: one line, no column separators."""
    return " ".join(text.split()).replace("|", "/")


def _weighted(records: list[IterationRecord], key: str) -> float:
    wall = sum(r.wall_s for r in records)
    return sum(getattr(r, key) * r.wall_s for r in records) / wall if wall else 0.0


def write_report(directory: str | Path, out: str | Path | None = None) -> list[Path]:
    """Write progress.png, bubbles.png, timeline.png (when timelines exist) and report.md;
    returns their paths."""
    run = load_run(directory)
    out = Path(out) if out else run.directory / "report"
    out.mkdir(parents=True, exist_ok=True)
    figures = {"progress.png": plot_progress(run), "bubbles.png": plot_bubbles(run)}
    if run.timelines:
        figures["timeline.png"] = plot_timeline(run)
    written = []
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)
    md = out / "report.md"
    md.write_text(summary_markdown(run, list(figures)))
    written.append(md)
    return written
