"""The planner against published measurements: for every row of the catalog's training table
(deploy/catalog/training.yaml) and serving table (deploy/catalog/measurements.yaml), the
roofline's prediction with the shipped factors over the published figure, the rows the
factors were fitted to apart from the rows held out (`use: check`).

Target: a median error within 15% on the held-out rows, for training and for decoding. The
last line is a JSON object (rows, worst and median |predicted / published - 1| per table and
set). Nothing runs on this machine but the arithmetic: every figure is a published one.

    python bench/plan_calibration.py [--catalog DIR ...] [--out runs/bench-plan-calibration]

Each invocation writes into a new directory under --out (bench/provenance.py): rows.json, every
row's prediction.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import OUT_HELP, Invocation  # noqa: E402
from streamrl.planning.calibration import error_summary, published_rows  # noqa: E402
from streamrl.planning.catalog import load_catalog  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--catalog", action="append", default=[], metavar="DIR",
                   help="another catalog folder (its rows join or replace the shipped ones)")
    p.add_argument("--out", default="runs/bench-plan-calibration", help=OUT_HELP)
    args = p.parse_args()
    inv = Invocation(args.out)
    catalog = load_catalog([Path(d) for d in args.catalog])
    rows = published_rows(catalog)
    for table in ("training", "decoding"):
        print(f"{table:<62} {'gpu':<10} {'use':<5} {'tp':>3} {'predicted/published':>20}  run")
        for r in (r for r in rows if r.table == table):
            print(f"{r.name:<62} {r.gpu:<10} {r.use:<5} {r.tp:>3} {r.ratio:>20.3f}  {r.shape}")
        print()
    for gpu in catalog.gpus:
        print(f"{gpu.name}: training matmuls at {gpu.train_matmul_efficiency}, attention at "
              f"{gpu.train_attention_efficiency} of peak ({gpu.train_efficiency_note})")
    (inv.dir / "rows.json").write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    report: dict = dict(error_summary(rows))
    report["check_median_within_15pct"] = {
        t: report[f"{t}_check"]["median_error"] is not None and report[f"{t}_check"]["median_error"] <= 0.15
        for t in ("training", "decoding")}
    print(inv.report(report))


if __name__ == "__main__":
    main()
