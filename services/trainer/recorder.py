"""Writes a run's record: metrics.jsonl (one object per iteration), lengths.jsonl (mean
output length per prompt), summary.json."""

from __future__ import annotations

import json
import time
from pathlib import Path


class Recorder:
    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = (self.out_dir / "metrics.jsonl").open("w")
        self._lengths = (self.out_dir / "lengths.jsonl").open("w")
        self.records: list[dict] = []
        self.started = time.monotonic()

    def iteration(self, record: dict) -> None:
        self.records.append(record)
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()

    def lengths(self, prompt_id: str, dataset_index: int, lengths: list[int]) -> None:
        """One line per consumed prompt: its samples' output lengths and their mean (what an
        oracle dispatcher of a rerun needs)."""
        self._lengths.write(json.dumps({"prompt_id": prompt_id, "dataset_index": dataset_index,
                                        "mean_length": sum(lengths) / len(lengths), "lengths": lengths}) + "\n")

    def summary(self, extra: dict) -> dict:
        rs = self.records
        num_samples = sum(r["num_samples"] for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        summary = {
            "num_iterations": len(rs),
            "num_samples": num_samples,
            "wall_s": round(time.monotonic() - self.started, 3),
            "train_wall_s": round(wall, 3),
            "samples_per_s": num_samples / wall if wall else 0.0,
            "reward_mean": sum(r["reward_mean"] * r["num_samples"] for r in rs) / num_samples if num_samples else 0.0,
            "pipeline_bubble_ratio": (
                sum(r["pipeline_bubble_ratio"] * r["wall_s"] for r in rs) / wall if wall else 0.0
            ),
            "skewness_bubble_ratio": (
                sum(r.get("skewness_bubble_ratio", 0.0) * r["wall_s"] for r in rs) / wall if wall else 0.0
            ),
            "policy_version": rs[-1]["policy_version"] if rs else 0,
            **extra,
        }
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def close(self) -> None:
        self._metrics.close()
        self._lengths.close()
