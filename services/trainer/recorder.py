"""Writes a run's record: metrics.jsonl (one IterationRecord per iteration), lengths.jsonl
(every consumed prompt's output lengths), summary.json (the RunSummary, once, at the end)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from streamrl.records import METRICS_FILE, SUMMARY_FILE, IterationRecord, RunSummary, write_json


class Recorder:
    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = (self.out_dir / METRICS_FILE).open("w")
        self._lengths = (self.out_dir / "lengths.jsonl").open("w")
        self.records: list[IterationRecord] = []
        self.started = time.monotonic()

    def iteration(self, record: IterationRecord) -> None:
        self.records.append(record)
        self._metrics.write(record.to_json() + "\n")
        self._metrics.flush()

    def lengths(self, prompt_id: str, dataset_index: int, lengths: list[int]) -> None:
        """One line per consumed prompt: its samples' output lengths and their mean (what an
        oracle dispatcher of a rerun needs)."""
        self._lengths.write(json.dumps({"prompt_id": prompt_id, "dataset_index": dataset_index,
                                        "mean_length": sum(lengths) / len(lengths), "lengths": lengths}) + "\n")

    def summary(self, **totals) -> RunSummary:
        """Write summary.json: the iterations' totals and the trainer's counters."""
        summary = RunSummary.of(self.records, wall_s=round(time.monotonic() - self.started, 3), **totals)
        write_json(self.out_dir / SUMMARY_FILE, summary)
        return summary

    def close(self) -> None:
        self._metrics.close()
        self._lengths.close()
