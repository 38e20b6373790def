"""`streamrl` command line: run | trainer | generator | ranker. Heavy imports happen per command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path


def _setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    torch.set_num_interop_threads(1)


def cmd_run(args) -> int:
    from streamrl.local.run import run

    return run(Path(args.job), Path(args.out) if args.out else None, quiet=args.quiet, prometheus=args.prometheus,
               cores=args.cores)


def cmd_trainer(args) -> int:
    import asyncio

    from streamrl.models import resolve_model_dir
    from streamrl.spec import PipelineMode, load_job

    job = load_job(args.job)
    _threads(args.threads or job.spec.trainer.threads)
    model_dir = Path(args.model_dir) if args.model_dir else resolve_model_dir(job.spec)
    if job.spec.pipeline.mode == PipelineMode.colocated:
        from streamrl.local.colocated import serve
    else:
        from streamrl.trainer.main import serve
    from streamrl.trainer.ranks import Ranks

    trainer = job.spec.trainer
    ranks = Ranks.from_environment(trainer.device, trainer.process_group_timeout_seconds)
    options = {"ranks": ranks} if ranks.world_size > 1 else {}
    return asyncio.run(serve(job, model_dir, Path(args.out), host=args.host,
                             endpoint_file=Path(args.endpoint_file) if args.endpoint_file else None,
                             ranker_address=args.ranker, admin_port=args.admin_port, **options))


def cmd_generator(args) -> int:
    import asyncio

    from streamrl.models import resolve_model_dir
    from streamrl.spec import load_job

    job = load_job(args.job)
    pools = {p.name: p for p in job.spec.generators.pools}
    _threads(pools[args.pool].threads if args.pool in pools else 1)
    model_dir = Path(args.model_dir) if args.model_dir else resolve_model_dir(job.spec)
    from streamrl.generator.main import serve

    return asyncio.run(serve(job, args.pool, args.trainer, model_dir, args.id, args.host, args.admin_port,
                             args.relay_port, args.advertise_host,
                             Path(args.endpoint_file) if args.endpoint_file else None,
                             Path(args.timeline) if args.timeline else None))


def cmd_ranker(args) -> int:
    import asyncio

    from streamrl.ranker.main import serve
    from streamrl.spec import load_job

    job = load_job(args.job)
    return asyncio.run(serve(job, Path(args.state) if args.state else None, args.host,
                             Path(args.endpoint_file) if args.endpoint_file else None, args.admin_port))


def cmd_operator(args) -> int:
    from streamrl.operator.main import run

    return run(args.namespace or [], args.health_port, args.metrics_port, args.prometheus_url)


def cmd_validate(args) -> int:
    from streamrl.operator.validate import run

    return run(args.files, args.show_defaults, sys.stdout)


def cmd_report(args) -> int:
    from streamrl.report import write_report

    written = write_report(Path(args.run_dir), Path(args.out) if args.out else None)
    for path in written:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrl", description="Disaggregated RL post-training of LLMs.")
    parser.add_argument("--log-level", default=os.environ.get("STREAMRL_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run an RLJob on this machine (trainer + generators as local processes)")
    p.add_argument("job", help="RLJob YAML file")
    p.add_argument("--out", help="run directory (default: runs/<name>-<time>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--prometheus", action="store_true",
                   help="start a Prometheus server (the `prometheus` binary on PATH) on loopback scraping every "
                        "process of the run, with StreamRL's rules; its data stays in <out>/prometheus "
                        "(autoscaling.mode Internal starts it anyway: the autoscaler reads it)")
    p.add_argument("--cores", type=int,
                   help="cores the run may use (default: those this process may run on); local autoscaling keeps "
                        "the generators' threads within it")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("validate", help="check RLJob files offline as the cluster would (CRD schema, CEL rules, "
                                        "the spec model); exit 1 when any has a problem")
    p.add_argument("files", nargs="+", metavar="FILE", help="RLJob YAML files (other kinds in them are skipped)")
    p.add_argument("--show-defaults", action="store_true", help="print each valid job with every default resolved")
    p.set_defaults(fn=cmd_validate)

    p = sub.add_parser("report", help="plots and a Markdown summary of a run directory")
    p.add_argument("run_dir", help="a run directory (what `streamrl run --out` wrote)")
    p.add_argument("--out", help="where to write the report (default: <run_dir>/report)")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("operator", help="run the Kubernetes operator (RLJob and RLCluster resources)")
    p.add_argument("--namespace", action="append", help="manage RLJobs in this namespace (repeatable; default: all)")
    p.add_argument("--health-port", type=int, default=8080, help="port of the /healthz liveness endpoint")
    p.add_argument("--metrics-port", type=int,  # None: the operator's settings read the environment at startup
                   help="port of the autoscaler's Prometheus /metrics (0 = none; default: env "
                        "STREAMRL_OPERATOR_METRICS_PORT, else 8081)")
    p.add_argument("--prometheus-url",
                   help="Prometheus HTTP API the autoscaler reads for RLJobs with autoscaling.mode Internal that "
                        "name none (spec.autoscaling.prometheusUrl); env STREAMRL_PROMETHEUS_URL")
    p.set_defaults(fn=cmd_operator)

    p = sub.add_parser("trainer", help="serve the trainer (coordinator, learner, weight publisher)")
    p.add_argument("job", help="RLJob YAML file")
    p.add_argument("--out", required=True, help="directory for metrics.jsonl, summary.json and the model")
    p.add_argument("--model-dir", help="initial policy directory (default: resolved from the spec)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--threads", type=int, help="torch threads (default: spec.trainer.threads)")
    p.add_argument("--endpoint-file", help="write {admin_port, grpc_port, pid} here once listening")
    p.add_argument("--ranker", help="ranker gRPC address host:port (skewness-aware dispatch)")
    p.add_argument("--admin-port", type=int, help="admin HTTP port (default: spec.trainer.adminPort)")
    p.set_defaults(fn=cmd_trainer)

    p = sub.add_parser("generator", help="serve one generator replica that dials the trainer")
    p.add_argument("job", help="RLJob YAML file")
    p.add_argument("--trainer", required=True, help="trainer gRPC address host:port")
    p.add_argument("--pool", default="default", help="generator pool of this replica")
    p.add_argument("--id", help="replica id (default: <pool>-<host>-<pid>)")
    p.add_argument("--model-dir", help="initial policy directory (default: resolved from the spec)")
    p.add_argument("--host", default="127.0.0.1", help="admin HTTP address")
    p.add_argument("--admin-port", type=int, default=0, help="admin HTTP port (0 = any)")
    p.add_argument("--relay-port", type=int, default=0, help="port serving held weights to pool peers (0 = any)")
    p.add_argument("--advertise-host", help="address peers use to reach the relay (default: --host)")
    p.add_argument("--endpoint-file", help="write {admin_port, grpc_port (its relay), pid} here once listening")
    p.add_argument("--timeline", help="append this replica's busy/idle spans to this JSONL file (run report)")
    p.set_defaults(fn=cmd_generator)

    p = sub.add_parser("ranker", help="serve the output-length ranker")
    p.add_argument("job", help="RLJob YAML file")
    p.add_argument("--state", help="state file (default: spec.ranker.statePath; none = in memory)")
    p.add_argument("--admin-port", type=int, help="admin HTTP port (default: spec.ranker.adminPort)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--endpoint-file", help="write {admin_port, grpc_port, pid} here once listening")
    p.set_defaults(fn=cmd_ranker)

    args = parser.parse_args(argv)
    _setup_logging(args.log_level)
    from streamrl.spec import SpecError

    try:
        return args.fn(args)
    except (SpecError, ValueError) as err:
        print(f"streamrl {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
