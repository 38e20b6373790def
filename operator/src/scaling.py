"""The operator's driver of elastic scaling, one round for one RLJob: the window to read (the
same as `streamrl run`'s: since the replicas settled), what to wait for, the policy's
decision (streamrl.scaling.policy, through the round both drivers share) and what follows
from it (the spec patch, status.autoscaling, Events, the ScalingLimited reason). Pure:
Prometheus's answers and the clock come in; autoscaler.py does the I/O and knows no policy."""

from __future__ import annotations

import datetime
import urllib.parse
from dataclasses import dataclass, field, replace

from streamrl.operator.phases import JobPhase, status_changes
from streamrl.scaling.inputs import MIN_WINDOW_ROUNDS, Inputs, query_window_s
from streamrl.scaling.policy import Decision, Pool, State
from streamrl.scaling.round import scaling_round
from streamrl.spec import RLJob

REPLICAS_FROM_POOLS = "streamrl.io/replicas-from-pools"
"""Annotation on an RLJob: the total of its pools' replicas the operator last wrote into
spec.generators.replicas (the /scale field). While the total is still that, it follows the
pools; a different total was written by /scale and is left alone."""
NO_PROMETHEUS = ("no Prometheus to read the scaling inputs from: set spec.autoscaling.prometheusUrl or the "
                 "operator's --prometheus-url (Helm value operator.prometheusUrl)")
EXTERNAL = ("External: generator replicas are left to whoever writes the RLJob's /scale subresource "
            "(spec.generators.replicas), e.g. a KEDA ScaledObject or an HPA")


@dataclass(frozen=True)
class Memory:
    """What the operator keeps of one RLJob's autoscaling between rounds (in memory only)."""

    state: State = field(default_factory=State)
    """The policy's own memory (recommendations, recent actions)."""
    settled_at: float | None = None
    """Unix seconds of the first round that found every replica asked for connected since
    the last change (None: not settled yet). The inputs are read since then (input_window_s)."""
    trainer_bound: bool = False
    """The last decision said trainer-bound (a TrainerBound Event is posted on the way in)."""

    @classmethod
    def from_status(cls, autoscaling: dict | None) -> Memory:
        """A job's first round (or the first after an operator restart): unsettled, so the
        inputs are measured afresh; whether the job was trainer-bound, as status recorded it."""
        return cls(trainer_bound=bool((autoscaling or {}).get("trainerBound")))


@dataclass(frozen=True)
class ScalingOutcome:
    """What one operator round writes: status, memory, replicas, Events."""

    status: dict
    """status.autoscaling as it should read now."""
    memory: Memory
    """To keep once the round's writes succeeded."""
    replicas: dict[str, int] | None = None
    """Replicas per pool to write into the spec; None = no change."""
    events: tuple[tuple[str, str, str], ...] = ()
    """(type Normal|Warning, reason, message) Events to post on the RLJob."""
    decision: Decision | None = None
    """The policy's decision; None when the round waited or could not read its inputs."""
    problem: bool = False
    """The round failed (no usable Prometheus, a query failed): a warning for the log."""


def timestamp(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def url_allowed(url: str, prefix: str) -> bool:
    """`url` is under `prefix`: the same scheme and host, the same port (any, when the prefix
    names none), its path under the prefix's, and no user part (`http://prom:9090@elsewhere`
    names another host than its text begins with)."""
    u, p = urllib.parse.urlsplit(url), urllib.parse.urlsplit(prefix)
    try:
        same_port = p.port is None or u.port == p.port
    except ValueError:
        return False
    return (u.scheme, u.hostname) == (p.scheme, p.hostname) and same_port and u.username is None and \
        u.path.startswith(p.path.rstrip("/")) and (u.path + "/").startswith(p.path.rstrip("/") + "/")


def prometheus_url(job: RLJob, default: str | None, allowed: tuple[str, ...] = ()) -> str:
    """The Prometheus HTTP API to read: the job's, when the operator's allow-list has its
    prefix (the operator makes the request from its own place in the network), else the
    operator's; ValueError naming the field when neither is usable."""
    url = job.spec.autoscaling.prometheus_url  # http(s) by the spec's own pattern
    if url is not None:
        if not any(url_allowed(url, prefix) for prefix in allowed):
            raise ValueError(f"spec.autoscaling.prometheusUrl {url} is not among the URLs the operator may read "
                             f"({', '.join(allowed) or 'none: it reads its own --prometheus-url only'}; Helm value "
                             "operator.prometheusUrlAllow)")
        return url
    if not default:
        raise ValueError(NO_PROMETHEUS)
    return default


def skip_reason(job: RLJob, phase: JobPhase | None) -> str | None:
    """Why an Internal job is not scaled this round (None = it is); `phase` as its status
    says (None before the first status)."""
    if job.spec.suspend:
        return "spec.suspend is true: nothing to scale"
    if phase is not None and phase.is_terminal:
        return f"the job is {phase.value}: nothing to scale"
    return None


def _base(memory: Memory, url: str | None, message: str, previous: dict | None) -> dict:
    """The fields every Internal round writes; the last decision and scale time carry over."""
    keep = {k: v for k, v in (previous or {}).items() if k in ("lastDecision", "lastScaleTime", "desiredReplicas")}
    return {"mode": "Internal", **({"prometheusUrl": url} if url else {}), **keep, "message": message,
            "trainerBound": memory.trainer_bound}


def waiting(memory: Memory, url: str | None, message: str, previous: dict | None,
            problem: bool = False) -> ScalingOutcome:
    """A round that decides nothing: skipped, or (problem) no usable Prometheus or a failed query."""
    return ScalingOutcome(_base(memory, url, message, previous), memory, problem=problem)


def _fmt(replicas: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in replicas.items())


def _inputs_status(inputs: Inputs, window: float) -> dict:
    obs = inputs.observation
    return {"windowSeconds": round(window, 1),
            **({"generationSeconds": round(obs.generation_s, 4), "trainSeconds": round(obs.train_s, 4),
                "idleNoWork": round(obs.idle_no_work, 4)} if obs else {}),
            "connected": dict(inputs.connected),
            "samplesPerSecond": {k: round(v, 4) for k, v in inputs.samples_per_s.items()}}


def limit(decision: Decision, pools: list[Pool], generation_s: float, train_s: float,
          step: int = 1) -> tuple[str, str] | None:
    """(reason, message) when more generators cannot help (no pool has room for a step of
    `step` replicas); None otherwise."""
    if decision.trainer_bound:
        return ("TrainerBound", f"training ({train_s:.2f}s per iteration) is the bottleneck and every pool is at its "
                                f"minReplicas: generation takes {generation_s:.2f}s")
    if generation_s > train_s and all(p.replicas + step > p.max_replicas for p in pools):
        maxima = _fmt({p.name: p.max_replicas for p in pools})
        return ("AtMaxReplicas", f"generation-bound ({generation_s:.2f}s vs training {train_s:.2f}s per iteration) "
                                 f"and every pool is at its maxReplicas ({maxima})")
    return None


def plan(job: RLJob, inputs: Inputs, memory: Memory, now: float, url: str,
         previous: dict | None = None) -> ScalingOutcome:
    """One Internal round over Prometheus's answers (parse_inputs of input_queries over
    query_window_s(now, memory.settled_at, interval)). Decides only once every replica asked for has been
    connected for two rounds: the inputs then cover the replicas as they are."""
    asked = job.spec.generators.pool_replicas()
    auto = job.spec.autoscaling
    interval = auto.interval_seconds
    seen = {"inputs": _inputs_status(inputs, query_window_s(now, memory.settled_at, interval))}
    rnd = scaling_round(auto, job.spec.generators, asked, inputs, memory.state, memory.settled_at, now)
    if rnd.waiting:
        memory = replace(memory, settled_at=rnd.settled_at)
        if rnd.waiting == "connecting":
            why = (f"waiting for the replicas asked for to connect: {_fmt(rnd.connected)} connected, "
                   f"{_fmt(asked)} asked for")
        elif rnd.waiting == "measuring":
            why = (f"waiting for {MIN_WINDOW_ROUNDS} rounds ({MIN_WINDOW_ROUNDS * interval}s) of measurements since "
                   f"every replica asked for connected ({_fmt(asked)}): older data predates the last change")
        else:
            why = f"waiting for two iterations to finish within the last {rnd.window_s:.0f}s (nothing to judge yet)"
        return ScalingOutcome({**_base(memory, url, why, previous), **seen}, memory)
    decision, obs, pools = rnd.decision, inputs.observation, list(rnd.pools)
    assert decision is not None and obs is not None  # a round that decided
    changed = decision.step != 0
    new_memory = replace(memory, state=decision.state, trainer_bound=decision.trainer_bound,
                         settled_at=rnd.settled_at)
    why = limit(decision, pools, obs.generation_s, obs.train_s, auto.step)
    status = {**_base(new_memory, url, decision.reason, previous), **seen,
              "desiredReplicas": dict(decision.replicas),
              "lastDecision": {"time": timestamp(now), "step": decision.step, "pool": decision.pool or "",
                               "reason": decision.reason},
              "limited": {"reason": why[0], "message": why[1]} if why else None}
    events: list[tuple[str, str, str]] = []
    if changed:
        assert decision.pool is not None  # a step names its pool
        old, new = asked[decision.pool], decision.replicas[decision.pool]
        status["lastScaleTime"] = timestamp(now)
        status["message"] = f"scaled pool {decision.pool} from {old} to {new}: {decision.reason}"
        events.append(("Normal", "ScaledUp" if decision.step > 0 else "ScaledDown", status["message"]))
    if decision.trainer_bound and not memory.trainer_bound:
        events.append(("Warning", "TrainerBound", why[1] if why else decision.reason))
    return ScalingOutcome(status, new_memory, dict(decision.replicas) if changed else None, tuple(events), decision)


def external_status() -> dict:
    return {"mode": "External", "message": EXTERNAL}


def scale_patch(body: dict, replicas: dict[str, int]) -> dict:
    """The merge patch writing the pools' replicas and their total (the field /scale acts
    on), guarded by the resourceVersion read: a concurrent edit makes it fail (409), not lost."""
    pools: list[dict] = [dict(p, replicas=replicas.get(p.get("name", "default"), p.get("replicas", 1)))
                         for p in body["spec"]["generators"]["pools"]]
    total = sum(p["replicas"] for p in pools)
    return {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"],
                         "annotations": {REPLICAS_FROM_POOLS: str(total)}},
            "spec": {"generators": {"pools": pools, "replicas": total}}}


def status_patch(old: dict | None, new: dict | None) -> dict | None:
    """The merge patch of the RLJob's status turning status.autoscaling from `old` into
    `new` (None = removed); None when nothing changes, so the write is skipped."""
    if new is None:
        return {"status": {"autoscaling": None}} if old is not None else None
    diff = status_changes(old or {}, new, whole=True)
    return {"status": {"autoscaling": diff}} if diff else None
