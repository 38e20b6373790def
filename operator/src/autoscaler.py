"""The autoscaler's I/O for one RLJob, one round: read the job and the scaling inputs
(Prometheus), run the pure round (scaling.py), then patch the pools' replicas, post the
Events, record the metrics and write status.autoscaling. Knows no policy."""

from __future__ import annotations

import logging
import time

import kopf

from streamrl.operator import scaling
from streamrl.operator.kube import KubeError, path_of
from streamrl.operator.phases import JobPhase
from streamrl.operator.reconcile import job_of
from streamrl.operator.runtime import Runtime
from streamrl.prometheus.api import PrometheusAPI, PrometheusError
from streamrl.scaling.inputs import input_queries, parse_inputs, query_window_s
from streamrl.spec import API_VERSION, KIND, RLJob, SpecError


async def _round(runtime: Runtime, job: RLJob, namespace: str, status: dict,
                 memory: scaling.Memory) -> scaling.ScalingOutcome:
    """Read the inputs from Prometheus (the job's series: scraped through the chart's
    PodMonitor they carry its namespace) and plan; what cannot be read is said, not raised."""
    previous = status.get("autoscaling")
    try:
        url = scaling.prometheus_url(job, runtime.settings.prometheus_url, runtime.settings.prometheus_url_allow)
    except ValueError as err:
        return scaling.waiting(memory, None, str(err), previous, problem=True)
    skip = scaling.skip_reason(job, JobPhase.of(status.get("phase")))
    if skip:
        return scaling.waiting(memory, url, skip, previous)
    now = time.time()
    window = query_window_s(now, memory.settled_at, job.spec.autoscaling.interval_seconds)
    queries = input_queries(job.metadata.name, window, namespace)
    try:
        results = await PrometheusAPI(url).aquery_all(queries)
    except PrometheusError as err:
        interval = job.spec.autoscaling.interval_seconds
        return scaling.waiting(memory, url, f"cannot read the scaling inputs (next try in {interval}s): {err}",
                               previous, problem=True)
    return scaling.plan(job, parse_inputs(results), memory, now, url, previous)


async def autoscale(runtime: Runtime, namespace: str, job_name: str,
                    logger: logging.Logger | logging.LoggerAdapter) -> float:
    """One autoscaler round for one RLJob: patch the replicas, post Events, record metrics,
    write status.autoscaling. Returns the seconds until the next round."""
    path = path_of(API_VERSION, KIND, namespace, job_name)
    body = await runtime.kube.get(path)
    try:
        job = job_of(body) if body else None
    except SpecError:
        job = None  # the spec handler reports it
    if job is None or body is None:  # (a job only from a body)
        return runtime.settings.status_interval_s
    key, status = f"{namespace}/{job_name}", body.get("status") or {}
    previous, mode = status.get("autoscaling"), job.spec.autoscaling.mode
    new = scaling.external_status() if mode == "External" else None  # Disabled: none
    if mode != "Internal":
        runtime.scaling.pop(key, None)
    else:
        memory = runtime.scaling.get(key) or scaling.Memory.from_status(previous)
        result = await _round(runtime, job, namespace, status, memory)
        if result.replicas is not None:
            try:
                await runtime.kube.patch(path, scaling.scale_patch(body, result.replicas))
            except KubeError as err:  # e.g. 409: the spec changed since it was read; the next round decides again
                logger.warning("autoscaler: replicas not written: %s", err)
                return job.spec.autoscaling.interval_seconds
        for kind, reason, message in result.events:
            kopf.event(body, type=kind, reason=reason, message=message)
        if result.decision is not None:
            d = result.decision
            runtime.metrics.record(job_name, d.replicas, d.step, d.pool, d.trainer_bound)
        runtime.scaling[key] = result.memory
        new = result.status
        if new["message"] != (previous or {}).get("message"):
            logger.log(logging.WARNING if result.problem else logging.INFO, "autoscaler: %s", new["message"])
    patch = scaling.status_patch(previous, new)
    if patch:
        await runtime.kube.patch(f"{path}/status", patch)
    return job.spec.autoscaling.interval_seconds
