"""`streamrl render`: every object the operator creates for an RLJob on its first reconcile,
as multi-document YAML, from the builders the operator itself runs, checked against
Kubernetes's own schemas (strict). For `kubectl apply --dry-run=server -f -`, a diff in
GitOps, or reading what a job becomes before applying it.

What only a cluster knows is stood in for, and said in a comment: there are no owner
references (the RLJob's uid does not exist yet), the token is random (the operator derives
its own from its key and that uid), a remote pool dials a placeholder (its trainer's
external address once the load balancer assigns one), and a job queued through Kueue shows
its pools and ranker at 0 replicas, as they stay until Kueue admits its trainer Job."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import TextIO

import yaml

from streamrl.operator.builders import build_children, queue_name
from streamrl.operator.pods import minted_token
from streamrl.operator.reconcile import validate
from streamrl.operator.remote import remote_children
from streamrl.operator.runtime import Runtime
from streamrl.operator.settings import Settings, load_settings
from streamrl.operator.validate import validate_file
from streamrl.spec import RLJob, SpecError

REMOTE_TRAINER = "TRAINER-EXTERNAL-ADDRESS:50051"
"""What a remote pool dials in a render (the operator writes the LoadBalancer's address or the node port)."""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap's job.yaml) as literal blocks, readable in a diff."""


_Dumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


class _NoCluster:
    """No API server: render builds, never reads or writes."""

    name = "render"


def render_job(job: RLJob, namespace: str, settings: Settings) -> list[tuple[str, dict]]:
    """(comment, object) for every object of the job: this cluster's, then each remote cluster's."""
    token = secrets.token_hex(32) if minted_token(job) else None
    local = build_children(job, namespace, settings, owner=None, token=token)
    runtime = Runtime(_NoCluster(), settings)  # type: ignore[arg-type]
    out = [("", o) for o in local]
    for cluster in sorted({p.cluster_ref for p in job.spec.generators.pools if p.cluster_ref}):
        for obj in remote_children(runtime, job, namespace, cluster, REMOTE_TRAINER, token, finished=False,
                                   held=queue_name(job) is not None):
            out.append((f"in cluster {cluster} (RLCluster), namespace {namespace}", obj))
    validate([o for _, o in out])
    return out


def run(paths: list[str], namespace: str, out: TextIO, err: TextIO | None = None) -> int:
    """Print every object of every valid RLJob in `paths`; problems go to `err` (stderr) as
    `FILE: field: message` (as `streamrl validate` prints them). 1 when any job has a problem."""
    err = err or sys.stderr
    settings = load_settings(os.environ)
    failed, first = False, True
    for name in paths:
        for verdict in validate_file(Path(name)):
            for where, message in verdict.problems:
                print(f"{verdict.source}: {where + ': ' if where else ''}{message}", file=err)
            failed |= bool(verdict.problems)
            if verdict.job is None:
                continue
            try:
                objects = render_job(verdict.job, namespace, settings)
            except SpecError as problem:
                print(f"{verdict.source}: {problem}", file=err)
                failed = True
                continue
            for comment, obj in objects:
                notes = [f"{verdict.source}: {obj['kind']} {obj['metadata']['name']}"]
                if comment:
                    notes.append(comment)
                if obj["kind"] == "Secret" and obj["metadata"]["name"].endswith("-token"):
                    notes.append("a random token: the operator derives the job's own from its key and the RLJob's uid")
                print(("" if first else "---\n") + "".join(f"# {n}\n" for n in notes)
                      + yaml.dump(obj, Dumper=_Dumper, sort_keys=False), end="", file=out)
                first = False
    return 1 if failed else 0
