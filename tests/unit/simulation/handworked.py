"""The hand-worked scenario test_sim_timelines.py and test_sim_overheads.py work their timelines
out on: two replicas, decode steps of 1 s at any batch, prompts of 0 tokens, output lengths
[4, 10] (prompt p0) and [6, 6] (p1) every iteration, training 0.1 s per padded token and a 1 s
optimizer step, a weight version taking 1 s over the link (1.25 GB at 10 Gbit/s)."""

from __future__ import annotations

import json

from streamrl.rollout.work import InFlight, PromptWork
from streamrl.simulation.replica import Sequence


def hand_scenario(tmp_path, mode: str, iterations: int = 3, pool: dict | None = None, trainer: dict | None = None,
                  **extra) -> dict:
    """The scenario as a dict; `pool` and `trainer` add to their table costs, `extra` to the top level."""
    lengths = tmp_path / "lengths.jsonl"
    lengths.write_text(json.dumps({"prompt_id": "0-0-0", "lengths": [4, 10]}) + "\n"
                       + json.dumps({"prompt_id": "0-1-1", "lengths": [6, 6]}) + "\n")
    return {
        "name": "hand", "pipeline": {"mode": mode, "minMicroBatchSize": 2},
        "algorithm": {"numIterations": iterations, "promptsPerStep": 2, "groupSize": 2, "microBatchSize": 4},
        "workload": {"promptTokens": 0, "maxNewTokens": 100, "lengths": {"type": "replay", "path": str(lengths)}},
        "trainer": {"cost": {"type": "table", "secondsPerToken": 0.1, "stepSeconds": 1.0, **(trainer or {})}},
        "generators": [{"name": "g", "replicas": 2, "cost": {"type": "table", "decodeStepSeconds": [[1, 1.0]],
                                                              "maxBatchSize": 4, **(pool or {})}}],
        "network": {"local": {"bandwidthGbps": 10, "latencyMs": 0}},
        "weights": {"sizeBytes": 1.25e9},
        **extra,
    }


def complete_group(prompt_id: str, prompt_tokens: int, lengths) -> InFlight[Sequence]:
    """A complete group as the simulator's GroupBook hands it to its trainer loop."""
    group = InFlight(PromptWork(prompt_id, 0, "", ()), 0, len(lengths), 0, 0)
    group.received = {i: Sequence(prompt_id, i, n, prompt_tokens, 0, 0.0) for i, n in enumerate(lengths)}
    return group
