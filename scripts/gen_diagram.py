"""Draw docs/architecture.svg, the picture of StreamRL's processes and what flows between them
(the README and docs/architecture.md show it). This script is its source: edit it, run it,
commit both.

    python scripts/gen_diagram.py [OUT_FILE]     # default: docs/architecture.svg
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COLOURS = {"trainer": "#dbe9f6", "generator": "#e2f0d9", "ranker": "#fdf2cc", "control": "#eeeeee",
           "pool": "#f7fbf4", "edge": "#444444", "weights": "#1f6fb2", "samples": "#2e7d32"}


def box(ax, x, y, w, h, title, lines=(), colour="control", size=10, dashed=False):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.12", linewidth=1.2,
                                edgecolor=COLOURS["edge"], facecolor=COLOURS[colour],
                                linestyle="--" if dashed else "-"))
    ax.text(x + w / 2, y + h - 0.22, title, ha="center", va="top", fontsize=size, fontweight="bold")
    for i, line in enumerate(lines):
        ax.text(x + w / 2, y + h - 0.55 - 0.3 * i, line, ha="center", va="top", fontsize=size - 2)


def arrow(ax, start, end, label, colour="edge", both=False, dashed=False, offset=(0.0, 0.12), rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>" if both else "-|>", mutation_scale=14,
                                 linewidth=1.6, color=COLOURS[colour], linestyle="--" if dashed else "-",
                                 connectionstyle=f"arc3,rad={rad}"))
    mid = ((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1])
    ax.text(*mid, label, ha="center", va="bottom", fontsize=8, color=COLOURS[colour],
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0})


def draw() -> plt.Figure:
    fig, ax = plt.subplots(figsize=(13, 7.2))
    ax.set_xlim(0, 13)
    ax.set_ylim(0, 7.2)
    ax.axis("off")
    # Control plane.
    box(ax, 0.3, 5.9, 4.4, 1.1, "streamrl run  |  operator (RLJob)",
        ["starts every process; scales pools on their bubbles"], size=10)
    box(ax, 8.4, 5.9, 4.3, 1.1, "Prometheus", ["bubble metrics of every process"], size=10)
    # Generator pools.
    box(ax, 0.3, 2.75, 4.4, 2.75, "pool l4  (this cluster)", colour="pool", size=9)
    for i in range(3):
        box(ax, 0.55 + i * 1.37, 3.05, 1.2, 1.75, f"gen-{i}", ["engine", "longest", "first"], "generator", 9)
    box(ax, 0.3, 0.2, 4.4, 2.2, "pool west  (other datacenter)", colour="pool", size=9, dashed=True)
    for i in range(2):
        box(ax, 0.75 + i * 2.0, 0.45, 1.45, 1.3, f"gen-w{i}", ["engine"], "generator", 9)
    arrow(ax, (2.2, 1.1), (2.75, 1.1), "relay", colour="weights", offset=(0.0, 0.3))
    # Trainer and ranker.
    box(ax, 6.3, 2.2, 3.3, 3.1, "trainer", ["rank 0: coordinator, dispatch,", "rewards, learner, weights",
                                            "", "ranks 1..N: FSDP2 shards", "(torch.distributed)"], "trainer", 11)
    box(ax, 10.4, 2.9, 2.3, 1.7, "ranker", ["predicts output", "length rank,", "learns online"], "ranker", 10)
    # What flows.
    arrow(ax, (6.2, 4.55), (4.8, 4.55), "prompts", offset=(0.0, 0.05))
    arrow(ax, (4.8, 3.85), (6.2, 3.85), "each sample\nas it finishes", colour="samples", offset=(0.0, 0.05))
    arrow(ax, (6.2, 3.05), (4.8, 3.05), "weights v+1", colour="weights", offset=(0.0, 0.05))
    arrow(ax, (6.3, 2.35), (1.5, 1.8), "one copy per version\nover the slow link", colour="weights",
          offset=(1.9, -0.75))
    arrow(ax, (9.7, 3.75), (10.35, 3.75), "rank\nobserve", both=True, offset=(0.0, 0.08))
    arrow(ax, (2.5, 5.85), (2.5, 5.55), "", dashed=True)
    arrow(ax, (8.35, 6.45), (4.8, 6.45), "pools scaled on the bubbles", dashed=True, offset=(0.0, 0.05))
    arrow(ax, (8.6, 5.35), (10.5, 5.85), "/metrics", dashed=True, offset=(-0.2, 0.05))
    ax.text(6.5, 0.6, "gRPC only between processes: Connect (a bidirectional stream), FetchWeights,\n"
                      "Rank/Observe. Generators dial the trainer; any may join, leave or die.",
            fontsize=9, color="#555555")
    return fig


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "architecture.svg"
    plt.rcParams["svg.hashsalt"] = "streamrl"  # the same drawing makes the same file
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, and a test reads it
    draw().savefig(target, format="svg", bbox_inches="tight", metadata={"Date": None})
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
