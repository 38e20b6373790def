"""The RLJob phase machine, in one place: observations in, status out. Pure (no I/O, the
clock passed in), so every transition is a table test. Knows the trainer only through its
typed /status (streamrl.records.TrainerStatus)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from enum import StrEnum

from streamrl.operator.admission import Admission
from streamrl.records import TrainerPhase, TrainerStatus


class JobPhase(StrEnum):
    """Where an RLJob is in its life (status.phase; the CRD's enum)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"
    """The spec cannot run (a new spec brings a new attempt)."""

    @property
    def is_terminal(self) -> bool:
        """Nothing more happens to this generation of the job (nothing to scale or refresh)."""
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.INVALID)

    @property
    def is_final(self) -> bool:
        """The job is over for good: its pools and ranker are at 0 and its trainer is never
        created again (to train again, create the RLJob anew). Invalid is not final: a new spec
        brings a new attempt."""
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED)

    @classmethod
    def of(cls, value: str | None) -> JobPhase | None:
        """The phase a status records; None before the first status (or an unknown string)."""
        try:
            return cls(value)
        except ValueError:
            return None


@dataclass(frozen=True)
class TrainerGroup:
    """What the operator did to the trainer Job this round (reconcile.ensure_trainer), and the
    job's counts of whole-group restarts."""

    action: str
    """created | unchanged | updated | rolling (replaced for a new spec) | restarting (a failed
    group deleted, to be created again) | waiting (the old Job is still being deleted) | failed
    (failed with no restart left) | suspended (no Job while suspended: Kueue owns its suspend) |
    finished"""
    restarts: int
    """Restarts after failures, counted against the budget."""
    message: str = ""
    job_status: dict | None = None
    """The Job's status as this round saw it (None: no Job before this round). The phase is
    read from it, never from a later read: a Job that failed in between is this round's
    "unchanged" group and the next round's restart, never a transient Failed."""
    preemptions: int = 0
    """Restarts after the group was stopped from outside (a preemption, a disruption, a
    suspension): free, the trainer resumes from its checkpoint."""
    admission: Admission = Admission()
    """Kueue's admission of the Job after this round (waiting: the pools and ranker are held)."""

    @property
    def replacing(self) -> bool:
        """Between an old Job and its replacement (the run goes on after)."""
        return self.action in ("rolling", "restarting", "waiting")


@dataclass(frozen=True)
class Observed:
    """What the operator saw of one RLJob and its children."""

    generation: int
    invalid: str | None = None
    """Why the spec cannot run (the field and the problem); None = valid."""
    suspended: bool = False
    trainer_job: dict | None = None
    """The trainer Job's status (batch/v1), None before it exists."""
    trainer_group: TrainerGroup | None = None
    """What was done to the trainer Job this round; None when nothing was (an invalid spec)."""
    trainer_pods: tuple[int, int] = (0, 0)
    """(trainer pods ready, trainer pods expected: spec.trainer.nodes, 0 while suspended)."""
    trainer: TrainerStatus | None = None
    """The trainer's own /status; None when it cannot be reached or did not parse."""
    trainer_unreadable: str | None = None
    """Why the trainer's /status body did not parse as a TrainerStatus (each field and its
    problem: a trainer of another version); None = parsed, or not reached."""
    pools: list[dict] = field(default_factory=list)
    """[{name, cluster, replicas, readyReplicas}] per generator pool."""
    cluster_problem: str | None = None
    """Why a pool's cluster cannot be used; None = all usable (or none remote)."""
    claim_problem: str | None = None
    """Why the trainer's pods cannot mount the checkpoint claim yet; None = they can (or none)."""
    ranker: dict | None = None
    """{ready, recall} when the job has a ranker."""
    label_selector: str = ""
    scaling_limited: tuple[str, str] | None = None
    """(reason, message) when the autoscaler cannot help (trainer-bound, every pool at its
    maximum while generation-bound); None = not limited or not autoscaled."""
    final: tuple[JobPhase, str] | None = None
    """(phase, message) the job already ended in (Succeeded or Failed): it stays there."""
    refused: tuple[str, str] | None = None
    """(reason, message) of a child that cannot be written: the API server refused it (a 4xx
    but 409 and 429; the reason is the server's) or another owner's object has its name
    (AlreadyExists). Phase Invalid until the spec changes."""
    pod_problems: tuple[tuple[str, str], ...] = ()
    """(reason, message) of what keeps the job's pods from running (unschedulable, an image
    that cannot be pulled, pods refused at admission, a crash loop), worst first."""


def _indexes(ranges: str) -> set[int]:
    """A Job's completedIndexes ("0-2,5") as a set."""
    out: set[int] = set()
    for part in filter(None, (ranges or "").split(",")):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def rank0_succeeded(job_status: dict | None) -> bool:
    """The trainer finished: rank 0's pod (index 0) succeeded. A multi-node Job's other indexes
    may exit 0 while rank 0 still gathers and saves the final model, so `status.succeeded` is
    no proof; the Job's Complete or SuccessCriteriaMet condition (its successPolicy names index
    0) or index 0 among completedIndexes are."""
    status = job_status or {}
    return any(c.get("type") in ("Complete", "SuccessCriteriaMet") and c.get("status") == "True"
               for c in status.get("conditions") or []) or 0 in _indexes(status.get("completedIndexes", ""))


def _condition(kind: str, ok: bool, reason: str, message: str, generation: int, previous: dict, now: str) -> dict:
    status = "True" if ok else "False"
    old = previous.get(kind)
    since = old["lastTransitionTime"] if old and old.get("status") == status and old.get("lastTransitionTime") else now
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since, "observedGeneration": generation}


def _job_finished(job_status: dict | None, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in (job_status or {}).get("conditions") or [])


FINISHED = "the trainer finished every iteration; generators and ranker scaled to 0"
AGAIN = "to train again, create the RLJob anew"


def _phase(obs: Observed) -> tuple[JobPhase, str]:
    trainer = obs.trainer
    if obs.invalid:
        return JobPhase.INVALID, obs.invalid
    if obs.refused:
        return JobPhase.INVALID, obs.refused[1]
    if obs.final:
        return obs.final
    if rank0_succeeded(obs.trainer_job):
        return JobPhase.SUCCEEDED, FINISHED
    group = obs.trainer_group
    replacing = group is not None and group.replacing
    if _job_finished(obs.trainer_job, "Failed") and not replacing:
        why = group.message if group and group.message else "the trainer failed; see its pods' logs"
        return JobPhase.FAILED, f"{why}; generators and ranker scaled to 0 ({AGAIN})"
    if obs.suspended:  # its group stopped on SIGTERM (saving a checkpoint) and is created again, suspended
        return JobPhase.SUSPENDED, "spec.suspend is true: every role is scaled to zero"
    if replacing:
        assert group is not None  # only a group is replaced
        return JobPhase.PENDING, group.message
    if group is not None and group.admission.waiting:
        return JobPhase.PENDING, group.admission.message
    if trainer is not None and trainer.phase == TrainerPhase.RUNNING:
        return JobPhase.RUNNING, f"iteration {trainer.iteration} of {trainer.num_iterations}"
    if obs.claim_problem:
        return JobPhase.PENDING, obs.claim_problem
    if obs.trainer_unreadable:
        return JobPhase.PENDING, f"the trainer's /status is unreadable: {obs.trainer_unreadable}"
    if obs.pod_problems:
        reason, message = obs.pod_problems[0]
        more = len(obs.pod_problems) - 1
        return JobPhase.PENDING, f"{reason}: {message}" + (f" (and {more} more problem(s))" if more else "")
    return JobPhase.PENDING, trainer.doing() if trainer else "waiting for the trainer and generators to start"


def _rfc3339(time_unix: float) -> str:
    return datetime.datetime.fromtimestamp(time_unix, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resumed_event(trainer: TrainerStatus | None, seen_incarnation: int) -> str | None:
    """The message of the `Resumed` Event to post when the trainer reports a start resumed
    from a checkpoint that no Event was posted for yet (`seen_incarnation`: the last start
    one was posted for or the status recorded, -1 = none); None: nothing to post."""
    if trainer is None or trainer.resumed_from is None or trainer.incarnation <= seen_incarnation:
        return None
    return (f"the trainer resumed at iteration {trainer.resumed_from} from its checkpoint "
            f"(start {trainer.incarnation + 1} of run {trainer.run_id})")


def derive(obs: Observed, previous_conditions: list[dict] | None, now: str) -> dict:
    """The status to write: phase, message, conditions and per-role progress."""
    previous = {c["type"]: c for c in previous_conditions or []}
    ready_generators = sum(p.get("readyReplicas", 0) for p in obs.pools)
    replicas = sum(p.get("replicas", 0) for p in obs.pools)
    phase, message = _phase(obs)
    g = obs.generation
    trainer = obs.trainer
    trainer_ready = trainer is not None and trainer.phase == TrainerPhase.RUNNING
    all_ready = trainer_ready and ready_generators > 0
    generators = f"{ready_generators}/{replicas} generators ready"
    pods_ready, pods_expected = obs.trainer_pods
    ranks = f"{pods_ready}/{pods_expected} trainer pods ready"
    if obs.trainer_unreadable and not trainer_ready:
        ready_reason, ready_message = ("TrainerStatusUnreadable",
                                       f"the trainer's /status is unreadable: {obs.trainer_unreadable}; {generators}")
    else:
        ready_reason = "AllRolesReady" if all_ready else "RolesStarting"
        ready_message = f"trainer {'running' if trainer_ready else 'not running'}, {ranks}, {generators}"
    terminal_failure = phase in (JobPhase.FAILED, JobPhase.INVALID)
    failed_reason = "InvalidSpec" if obs.invalid else obs.refused[0] if obs.refused else phase.value
    pods_reason, pods_message = obs.pod_problems[0] if obs.pod_problems else ("PodsRunning", "")
    admission = obs.trainer_group.admission if obs.trainer_group else Admission()
    conditions = [
        _condition("Ready", all_ready, ready_reason, ready_message, g, previous, now),
        _condition("Progressing", phase == JobPhase.RUNNING, phase.value, message, g, previous, now),
        _condition("Suspended", phase == JobPhase.SUSPENDED, "SpecSuspend" if obs.suspended else "NotSuspended", "",
                   g, previous, now),
        _condition("Complete", phase == JobPhase.SUCCEEDED, phase.value, "", g, previous, now),
        _condition("Failed", terminal_failure, failed_reason, message if terminal_failure else "", g, previous, now),
        _condition("PodsReady", not obs.pod_problems, pods_reason, pods_message, g, previous, now),
        _condition("ScalingLimited", obs.scaling_limited is not None,
                   obs.scaling_limited[0] if obs.scaling_limited else "NotLimited",
                   obs.scaling_limited[1] if obs.scaling_limited else "", g, previous, now),
        _condition("ClustersReady", obs.cluster_problem is None,
                   "ClustersReachable" if obs.cluster_problem is None else "ClusterUnavailable",
                   obs.cluster_problem or "", g, previous, now),
        _condition("Queued", admission.waiting, admission.reason, admission.message, g, previous, now),
    ]
    status = {
        "phase": phase.value,
        "message": message,
        **({"completionTime": now} if phase.is_final and obs.final is None else {}),
        "observedGeneration": g,
        "conditions": conditions,
        "generators": {"replicas": replicas, "readyReplicas": ready_generators, "labelSelector": obs.label_selector,
                       "pools": obs.pools},
    }
    group = obs.trainer_group
    status["trainer"] = {"ready": trainer_ready, "readyPods": pods_ready, "expectedPods": pods_expected,
                         "restarts": group.restarts if group else 0, "preemptions": group.preemptions if group else 0}
    if trainer is not None:
        last, saved = trainer.last, trainer.last_checkpoint
        status["trainer"].update({
            "iteration": trainer.iteration, "policyVersion": trainer.policy_version,
            **({"reward": last.reward_mean, "pipelineBubbleRatio": last.pipeline_bubble_ratio} if last else {}),
            "samplesPerSecond": trainer.samples_per_s,
            # written even when None: the status is merge-patched, and a null removes what an earlier start left
            "incarnation": trainer.incarnation, "resumedFrom": trainer.resumed_from,
            "lastCheckpoint": {"iteration": saved.iteration, "time": _rfc3339(saved.time_unix)} if saved else None,
        })
    if obs.ranker is not None:
        status["ranker"] = obs.ranker
    return status


def status_changes(old: dict, new: dict, whole: bool = False) -> dict:
    """The merge patch that writes `new` over `old`: only what differs (None removes a key
    `old` has); keys `new` does not name are left as they are (other writers' parts, progress
    an unreachable trainer reported before), or with `whole`, removed (`new` is all there is).
    Empty when nothing changes: nothing is sent."""
    out: dict = {key: None for key in old.keys() - new.keys()} if whole else {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            inner = status_changes(before, value, whole)
            if inner:
                out[key] = inner
        elif value is None:
            if before is not None:
                out[key] = None
        elif value != before:
            out[key] = value
    return out
