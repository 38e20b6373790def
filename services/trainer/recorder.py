"""Writes a run's record: metrics.jsonl (one IterationRecord per iteration), lengths.jsonl
(every consumed prompt's output lengths), ledger.jsonl (the prompt ids each iteration
trained, with the trainer's incarnation), summary.json (the RunSummary, at the end). A
resumed run continues them from its checkpoint's iteration: lines of the iterations after it
(trained again now) are dropped, so no iteration appears twice."""

from __future__ import annotations

import json
import time
from pathlib import Path

from streamrl.records import METRICS_FILE, SUMMARY_FILE, IterationRecord, RunSummary, write_json

LENGTHS_FILE, LEDGER_FILE = "lengths.jsonl", "ledger.jsonl"


def prompt_iteration(prompt_id: str) -> int:
    """The iteration a prompt id was drawn for ("<iteration>-<k>-<index>")."""
    return int(prompt_id.split("-", 1)[0])


def _keep_lines(path: Path, keep) -> None:
    """Rewrite a JSONL file with the lines `keep` accepts (a partial last line is dropped)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if keep(json.loads(line)):
                kept.append(line)
        except ValueError:
            continue  # a line a killed trainer left half-written
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


class Recorder:
    def __init__(self, out_dir: Path, resume_at: int | None = None):
        """Start the run's files afresh, or (`resume_at`) continue them from that iteration."""
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.records: list[IterationRecord] = []
        self.started = time.monotonic()
        if resume_at is None:
            self._open("w")
        else:
            self._resume_at(resume_at)

    def _open(self, mode: str) -> None:
        self._metrics = (self.out_dir / METRICS_FILE).open(mode)
        self._lengths = (self.out_dir / LENGTHS_FILE).open(mode)
        self._ledger = (self.out_dir / LEDGER_FILE).open(mode)

    def _resume_at(self, iteration: int) -> None:
        """Continue the files of a run resumed at `iteration`: what came after it is dropped."""
        _keep_lines(self.out_dir / METRICS_FILE, lambda r: r["iteration"] < iteration)
        _keep_lines(self.out_dir / LENGTHS_FILE, lambda r: prompt_iteration(r["prompt_id"]) < iteration)
        _keep_lines(self.out_dir / LEDGER_FILE, lambda r: r["iteration"] < iteration)
        metrics = self.out_dir / METRICS_FILE
        self.records = IterationRecord.read_lines(metrics) if metrics.exists() else []
        self._open("a")

    def iteration(self, record: IterationRecord) -> None:
        self.records.append(record)
        self._metrics.write(record.to_json() + "\n")
        self._metrics.flush()

    def trained(self, iteration: int, prompt_ids: list[str], incarnation: int) -> None:
        """The ledger: which prompts an iteration trained, by which start of the trainer."""
        self._ledger.write(json.dumps({"iteration": iteration, "incarnation": incarnation,
                                       "prompt_ids": prompt_ids}) + "\n")
        self._ledger.flush()

    def lengths(self, prompt_id: str, dataset_index: int, lengths: list[int],
                predicted_length: float | None = None) -> None:
        """One line per consumed prompt: its samples' output lengths and their mean (what an
        oracle dispatcher of a rerun needs) and, where it was dispatched with one, the mean
        length predicted for it (the ranker's quality, and what `streamrl simulate` replays)."""
        line = {"prompt_id": prompt_id, "dataset_index": dataset_index, "mean_length": sum(lengths) / len(lengths),
                "lengths": lengths}
        if predicted_length is not None:
            line["predicted_length"] = round(predicted_length, 3)
        self._lengths.write(json.dumps(line) + "\n")

    def summary(self, **totals) -> RunSummary:
        """Write summary.json: the iterations' totals and the trainer's counters."""
        summary = RunSummary.of(self.records, wall_s=round(time.monotonic() - self.started, 3), **totals)
        write_json(self.out_dir / SUMMARY_FILE, summary)
        return summary

    def close(self) -> None:
        self._metrics.close()
        self._lengths.close()
        self._ledger.close()
