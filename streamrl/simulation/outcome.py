"""What a simulated run produced, one record each (written by the simulator, read by the CLI and
bench/sim_fidelity.py): iterations as the trainer records them (the same bubble ratios), each
stage's GPU use, and the summary with the autoscaler's decisions."""

from __future__ import annotations

from streamrl.records import Record, ScalingRecord

ITERATIONS_FILE = "iterations.jsonl"
SUMMARY_FILE = "simulation.json"


class SimIteration(Record):
    iteration: int
    start_s: float
    """Simulated seconds since the run started."""
    wall_s: float
    generation_s: float
    """From the iteration's start until the trainer took its last sample."""
    train_s: float
    """Forward/backward plus the optimizer step."""
    num_samples: int
    samples_per_s: float
    pipeline_bubble_ratio: float
    """Trainer seconds idle waiting for samples / wall seconds."""
    skewness_bubble_ratio: float
    """Replica seconds decoding below lowOccupancy of the batch cap with nothing waiting /
    (replicas x wall seconds)."""
    completion_tokens_mean: float
    completion_tokens_max: int
    staleness_mean: float
    staleness_max: int
    weight_sync_s_max: float
    """Slowest replica's seconds from the notice to the swap of the version this iteration started from."""
    replicas: int
    """Generator replicas connected at the iteration's end."""


class StageUse(Record):
    """One stage (the trainer, or one generator pool) over the run."""

    name: str
    gpus: int
    """GPUs held at the end (a pool: replicas x GPUs per replica)."""
    utilisation: float
    """Busy seconds / seconds held, over every process of the stage."""
    gpu_seconds: float
    cost: float
    """GPU-hours x the stage's GPU-hour price."""


class SimSummary(Record):
    scenario: str
    mode: str
    policy: str
    num_iterations: int
    num_samples: int
    wall_s: float
    """Sum of the iterations' wall seconds (what samples/s divides by, as in RunSummary)."""
    makespan_s: float
    """Simulated seconds from the start to the last iteration's end."""
    samples_per_s: float
    iteration_s_mean: float
    generation_s_mean: float
    train_s_mean: float
    pipeline_bubble_ratio: float
    """Wall-weighted over the iterations."""
    skewness_bubble_ratio: float
    """Wall-weighted over the iterations."""
    stages: list[StageUse]
    gpu_seconds: float
    cost: float
    samples_per_cost: float
    """Samples per unit of cost (GPU-hour price units)."""
    weight_bytes_local: float
    weight_bytes_cross_datacenter: float
    scaling: list[ScalingRecord] = []
    """The autoscaler's decisions that changed something (time_unix: simulated seconds)."""
    scale_ups: int = 0
    scale_downs: int = 0
    replicas_final: dict[str, int] = {}
    simulated_in_s: float = 0.0
    """Seconds of this machine's time the simulation took."""

    def table(self) -> str:
        """A person's view: the headline figures and one line per stage."""
        lines = [
            f"{self.scenario}: {self.mode}, {self.policy}, {self.num_iterations} iterations, "
            f"{self.num_samples} samples",
            f"  samples/s {self.samples_per_s:.2f}   iteration {self.iteration_s_mean:.2f}s (generation "
            f"{self.generation_s_mean:.2f}s, training {self.train_s_mean:.2f}s)",
            f"  pipeline bubble {self.pipeline_bubble_ratio:.3f}   skewness bubble {self.skewness_bubble_ratio:.3f}",
            f"  GPU-seconds {self.gpu_seconds:.0f}   cost {self.cost:.3g}   "
            f"samples per cost {self.samples_per_cost:.4g}",
            f"  {'stage':<16} {'GPUs':>5} {'utilisation':>12} {'GPU-seconds':>12} {'cost':>10}",
        ]
        lines += [f"  {s.name:<16} {s.gpus:>5} {s.utilisation:>12.1%} {s.gpu_seconds:>12.0f} {s.cost:>10.3g}"
                  for s in self.stages]
        if self.scaling:
            lines.append(f"  autoscaling: {self.scale_ups} up, {self.scale_downs} down; final "
                         + ", ".join(f"{k}={v}" for k, v in self.replicas_final.items()))
            lines += [f"    t={r.time_unix:.0f}s {r.step:+d} {r.pool}: {r.reason}" for r in self.scaling]
        return "\n".join(lines)
