"""The RLJob phase machine, in one place: observations in, status out. Pure (no I/O, the
clock passed in), so every transition is a table test."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Observed:
    """What the operator saw of one RLJob and its children."""

    generation: int
    invalid: str | None = None
    """Why the spec cannot run (the field and the problem); None = valid."""
    suspended: bool = False
    trainer_job: dict | None = None
    """The trainer Job's status (batch/v1), None before it exists."""
    trainer: dict | None = None
    """The trainer's own /status, None when it cannot be reached."""
    pools: list[dict] = field(default_factory=list)
    """[{name, cluster, replicas, readyReplicas}] per generator pool."""
    cluster_problem: str | None = None
    """Why a pool's cluster cannot be used; None = all usable (or none remote)."""
    ranker: dict | None = None
    """{ready, recall} when the job has a ranker."""
    label_selector: str = ""
    scaling_limited: tuple[str, str] | None = None
    """(reason, message) when the autoscaler cannot help (trainer-bound, every pool at its
    maximum while generation-bound); None = not limited or not autoscaled."""


def _condition(kind: str, ok: bool, reason: str, message: str, generation: int, previous: dict, now: str) -> dict:
    status = "True" if ok else "False"
    old = previous.get(kind)
    since = old["lastTransitionTime"] if old and old.get("status") == status and old.get("lastTransitionTime") else now
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since, "observedGeneration": generation}


def _job_finished(job_status: dict | None, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in (job_status or {}).get("conditions") or [])


def derive(obs: Observed, previous_conditions: list[dict] | None, now: str) -> dict:
    """The status to write: phase, message, conditions and per-role progress."""
    previous = {c["type"]: c for c in previous_conditions or []}
    ready_generators = sum(p.get("readyReplicas", 0) for p in obs.pools)
    replicas = sum(p.get("replicas", 0) for p in obs.pools)
    trainer = obs.trainer or {}
    if obs.invalid:
        phase, message = "Invalid", obs.invalid
    elif _job_finished(obs.trainer_job, "Complete") or (obs.trainer_job or {}).get("succeeded"):
        phase, message = "Succeeded", "the trainer finished every iteration"
    elif _job_finished(obs.trainer_job, "Failed"):
        phase, message = "Failed", "the trainer failed; see its pod's log"
    elif obs.suspended:
        phase, message = "Suspended", "spec.suspend is true: every role is scaled to zero"
    elif trainer.get("phase") == "Running":
        phase, message = "Running", f"iteration {trainer.get('iteration', 0)} of {trainer.get('num_iterations', '?')}"
    else:
        phase, message = "Pending", trainer.get("phase") or "waiting for the trainer and generators to start"
    g = obs.generation
    trainer_ready = trainer.get("phase") == "Running"
    conditions = [
        _condition("Ready", trainer_ready and ready_generators > 0,
                   "AllRolesReady" if trainer_ready and ready_generators > 0 else "RolesStarting",
                   f"trainer {'running' if trainer_ready else 'not running'}, {ready_generators}/{replicas} "
                   "generators ready", g, previous, now),
        _condition("Progressing", phase == "Running", phase, message, g, previous, now),
        _condition("Suspended", phase == "Suspended", "SpecSuspend" if obs.suspended else "NotSuspended", "",
                   g, previous, now),
        _condition("Complete", phase == "Succeeded", phase, "", g, previous, now),
        _condition("Failed", phase in ("Failed", "Invalid"), "InvalidSpec" if obs.invalid else phase,
                   message if phase in ("Failed", "Invalid") else "", g, previous, now),
        _condition("ScalingLimited", obs.scaling_limited is not None,
                   obs.scaling_limited[0] if obs.scaling_limited else "NotLimited",
                   obs.scaling_limited[1] if obs.scaling_limited else "", g, previous, now),
        _condition("ClustersReady", obs.cluster_problem is None,
                   "ClustersReachable" if obs.cluster_problem is None else "ClusterUnavailable",
                   obs.cluster_problem or "", g, previous, now),
    ]
    status = {
        "phase": phase,
        "message": message,
        "observedGeneration": g,
        "conditions": conditions,
        "generators": {"replicas": replicas, "readyReplicas": ready_generators, "labelSelector": obs.label_selector,
                       "pools": obs.pools},
    }
    if obs.trainer:
        last = trainer.get("last") or {}
        status["trainer"] = {
            "ready": trainer_ready, "iteration": int(trainer.get("iteration", 0)),
            "policyVersion": int(trainer.get("policy_version", 0)),
            **({"reward": float(last["reward_mean"])} if "reward_mean" in last else {}),
            **({"pipelineBubbleRatio": float(last["pipeline_bubble_ratio"])}
               if "pipeline_bubble_ratio" in last else {}),
            "samplesPerSecond": float(trainer.get("samples_per_s", 0.0)),
        }
    if obs.ranker is not None:
        status["ranker"] = obs.ranker
    return status
