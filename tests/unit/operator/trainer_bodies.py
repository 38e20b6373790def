"""A trainer's /status body as the trainer writes it (through streamrl.records), for the
operator's tests: a real TrainerStatus serialized, with the fields a test names changed."""

from __future__ import annotations

from streamrl.records import IterationRecord, TrainerPhase, TrainerStatus


def last_iteration(iteration: int = 3, reward_mean: float = 0.5, pipeline_bubble_ratio: float = 0.1) -> IterationRecord:
    return IterationRecord(
        iteration=iteration, policy_version=iteration, reward_mean=reward_mean, num_samples=64, samples_per_s=100.0,
        pipeline_bubble_ratio=pipeline_bubble_ratio, skewness_bubble_ratio=0.0, wall_s=0.64, generation_s=0.5,
        train_s=0.1, completion_tokens_mean=12.0, completion_tokens_max=20, loss=0.1, clip_fraction=0.0, kl=0.0,
        grad_norm=1.0, num_micro_batches=1, staleness_mean=0.0, staleness_max=0, num_samples_stale_dropped=0,
        weight_sync_s_max=0.01, weight_bytes_from_trainer=1024, weight_bytes_from_peers=0, elapsed_s=3.0,
        time_unix=1_800_000_000.0)


def trainer_status(phase: TrainerPhase = TrainerPhase.RUNNING, iteration: int = 3, num_iterations: int = 10,
                   samples_per_s: float = 100.0, last: IterationRecord | None = None) -> TrainerStatus:
    return TrainerStatus(run_id="tiny-0", phase=phase, mode="disaggregated", iteration=iteration,
                         num_iterations=num_iterations, policy_version=iteration, num_samples_accepted=64 * iteration,
                         samples_per_s=samples_per_s, uptime_s=5.0,
                         last=last if last is not None else last_iteration(iteration) if iteration else None)


def body(**fields) -> dict:
    """The JSON body of trainer_status(**fields), as GET /status returns it."""
    return trainer_status(**fields).model_dump(mode="json", exclude_none=True)
