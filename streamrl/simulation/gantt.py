"""The simulated run's Gantt chart: the run report's timeline (streamrl/report.py, the same
colours and reasons) drawn from the simulated tracks, with the iteration ends; at hundreds of
replicas only the first `max_rows` generators get a row."""

from __future__ import annotations

from pathlib import Path

from streamrl.simulation.events import Track
from streamrl.simulation.outcome import SimIteration, SimSummary


def write_gantt(path: Path, tracks: list[Track], iterations: list[SimIteration], summary: SimSummary,
                max_rows: int = 24) -> Path:
    """Write the PNG; `tracks` is the trainer's first, then the generators'."""
    from streamrl import report

    shown = tracks[: max_rows + 1]
    run = report.Run(Path(path).parent, summary.scenario, [], timelines={t.name: t.as_dicts() for t in shown})
    fig = report.plot_timeline(run)
    ax = fig.axes[0]
    for r in iterations:
        ax.axvline(r.start_s + r.wall_s, color="#636363", lw=0.4, alpha=0.5)
    hidden = len(tracks) - len(shown)
    ax.set_xlabel("simulated seconds (grey lines: iteration ends)")
    ax.set_title(f"{summary.scenario}: {summary.mode}, {summary.policy}, {summary.samples_per_s:.3g} samples/s, "
                 f"pipeline bubble {summary.pipeline_bubble_ratio:.2f}, skewness bubble "
                 f"{summary.skewness_bubble_ratio:.2f}" + (f" ({hidden} more replicas not drawn)" if hidden else ""),
                 fontsize=9)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    report.plt.close(fig)
    return path
