"""`streamrl` command line: run | validate | render | trainer | generator | ranker | plan | profile | simulate | ...
Heavy imports are per command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any


def _setup_logging(level: str = "INFO", offline: bool = True) -> None:
    """Logging to stderr, and the Hugging Face libraries quiet and, unless `offline` is False
    (fetch: downloading is its job) or the user said otherwise, off the network: every other
    command reads the cache that fetch filled."""
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpx2"):  # a line per request (httpx2: huggingface_hub's)
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if offline:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _threads(n: int) -> None:
    """n torch threads for the process's compute thread, one for its others (streamrl.compute)."""
    from streamrl import compute

    compute.set_threads(n)


def cmd_run(args) -> int:
    from streamrl.local.run import run

    return run(Path(args.job), Path(args.out) if args.out else None, quiet=args.quiet, prometheus=args.prometheus,
               cores=args.cores, fresh=args.fresh)


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
    options: dict[str, Any] = {"ranks": ranks} if ranks.world_size > 1 else {}
    if args.preempted_exit_code:
        options["preempted_exit_code"] = args.preempted_exit_code
    return asyncio.run(serve(job, model_dir, Path(args.out), host=args.host,
                             endpoint_file=Path(args.endpoint_file) if args.endpoint_file else None,
                             ranker_address=args.ranker, admin_port=args.admin_port, **options))


def cmd_generator(args) -> int:
    import asyncio

    from streamrl.spec import load_job

    job = load_job(args.job)
    pools = {p.name: p for p in job.spec.generators.pools}
    _threads(pools[args.pool].threads if args.pool in pools else 1)
    model_dir = Path(args.model_dir) if args.model_dir else None  # None: it boots from the trainer
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


def cmd_render(args) -> int:
    try:
        from streamrl.operator.render import run
    except ImportError as err:
        print(f"streamrl render builds the objects with the operator's code, which needs the operator extra "
              f"(pip install 'streamrl[operator]'): {err}", file=sys.stderr)
        return 2
    return run(args.files, args.namespace, sys.stdout)


def cmd_fetch(args) -> int:
    from streamrl.models import resolve_model_dir
    from streamrl.spec import TaskName, load_job
    from streamrl.tasks import task_file

    job = load_job(args.job)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        print(resolve_model_dir(job.spec, log=say, progress_every_s=args.progress_every))
        if job.spec.task.name == TaskName.jsonl:
            print(task_file(job.spec.task, log=say))
    except ValueError as err:
        print(f"streamrl fetch: {err}", file=sys.stderr)
        return 2
    return 0


def cmd_report(args) -> int:
    from streamrl.report import write_report

    written = write_report(Path(args.run_dir), Path(args.out) if args.out else None)
    for path in written:
        print(path)
    return 0


def cmd_plan(args) -> int:
    import math

    from streamrl.planning.calibration import calibrate, load_assumptions
    from streamrl.planning.catalog import load_catalog
    from streamrl.planning.costs import TrainerMemory
    from streamrl.planning.demand import LengthDistribution
    from streamrl.planning.estimates import Estimates
    from streamrl.planning.plan_inputs import model_shape, parse_budget, parse_mapping, profiles_by_type
    from streamrl.planning.planned import format_table, planned_yaml
    from streamrl.planning.planner import Links, PlanJob, Planner
    from streamrl.planning.profile_record import load_profile
    from streamrl.planning.roofline import Assumptions
    from streamrl.spec import load_job

    job = load_job(args.job)
    spec = job.spec
    catalog = load_catalog([Path(p) for p in args.catalog or []])
    budget = parse_budget(args.gpus, catalog)
    shape = model_shape(spec, catalog, args.model)
    max_length = args.max_length or spec.algorithm.max_new_tokens
    if args.lengths:
        workload = LengthDistribution.from_lengths_file(args.lengths, args.prompt_tokens, max_length)
    elif args.lognormal:
        try:
            mu, sigma = (float(x) for x in args.lognormal.split(","))
        except ValueError:
            raise ValueError(f"--lognormal {args.lognormal!r}: expected MU,SIGMA (of ln length)") from None
        workload = LengthDistribution.lognormal(mu, sigma, max_length, args.prompt_tokens)
    else:
        median = max(1, max_length // 4)
        workload = LengthDistribution.lognormal(math.log(median), 1.0, max_length, args.prompt_tokens)
        print(f"no --lengths or --lognormal: assuming lognormal output lengths, median {median} tokens, sigma 1",
              file=sys.stderr)
    plan_job = PlanJob(spec.algorithm.prompts_per_step * spec.algorithm.group_size, spec.algorithm.micro_batch_size,
                       max_length, spec.pipeline.mode.value)
    assumptions = load_assumptions(args.assumptions) if args.assumptions else Assumptions()
    if args.calibrate:
        profile = load_profile(args.calibrate)
        if not profile.hardware.gpu_type:
            raise ValueError(f"--calibrate {args.calibrate}: the profile names no GPU type (measure with --gpu-type)")
        assumptions, notes = calibrate(profile, catalog.gpu(profile.hardware.gpu_type, "--calibrate"), assumptions)
        print("calibrated: " + "; ".join(notes), file=sys.stderr)
    if spec.model.dtype == "float32" and assumptions.weight_bytes_per_param == 2:
        print("note: the plan assumes BF16 weights (weight_bytes_per_param 2); spec.model.dtype is float32",
              file=sys.stderr)
    algorithm = args.algorithm or spec.algorithm.type  # ppo: the critic's passes and model state too
    own = spec.trainer.memory
    memory = TrainerMemory(own.activation_checkpointing, own.cpu_offload, own.tensor_parallel)
    estimates = Estimates(shape, plan_job, workload, algorithm, spec.algorithm.kl_coef > 0, assumptions,
                          profiles_by_type(args.profile, catalog), memory)
    links = Links(args.network_gb_s, args.cross_dc_gb_s, args.cross_dc_latency_s)
    plan = Planner(catalog, estimates, plan_job, workload, links, args.tolerance).plan(budget, args.objective)
    table = format_table(plan, shape.describe(), workload)
    print(table)
    if args.out:
        Path(args.out).write_text(planned_yaml(job, plan, table, parse_mapping(args.cluster_ref, "--cluster-ref")))
        print(f"planned job: {args.out}")
    return 0


def _cpu_name() -> str:
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cmd_profile(args) -> int:
    import tempfile
    from datetime import UTC, datetime

    import torch

    from streamrl import compute
    from streamrl.generator.engine import setup_engine
    from streamrl.generator.profile import measure_generation
    from streamrl.local.colocated import measure_serving
    from streamrl.models import build_tiny_model, check_model_dir, eos_token_id, load_model, load_tokenizer
    from streamrl.planning.catalog import load_catalog
    from streamrl.planning.profile_record import Profile, ProfileEngine, ProfileHardware, ProfileModel, plot_ptl
    from streamrl.planning.shape import ModelShape
    from streamrl.rewards import sample_scorer
    from streamrl.spec import load_job
    from streamrl.tasks import load_prompts
    from streamrl.trainer.profile import coordinator_for, measure_samples, measure_training

    job = load_job(args.job)
    spec = job.spec
    _threads(args.threads)
    gpu_type = load_catalog().gpu(args.gpu_type, field="--gpu-type").name if args.gpu_type else None
    pools = {p.name: p for p in spec.generators.pools}
    if args.pool and args.pool not in pools:
        raise ValueError(f"--pool {args.pool!r}: the job has no such pool ({', '.join(pools)})")
    pool = pools[args.pool] if args.pool else spec.generators.pools[0]
    if pool.engine.type == "vllm":
        from streamrl.vllm_args import check_job

        check_job(job, args.job)  # vLLM installed here, its engineArgs known to it
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")] if args.batch_sizes else None
    completion_tokens = args.completion_tokens or spec.algorithm.max_new_tokens
    out = Path(args.out)
    # The engine and the learner on one thread, the compute thread a process of the product
    # runs them on (streamrl.compute).
    with tempfile.TemporaryDirectory() as tmp, compute.executor("compute") as compute_thread:
        if args.model_dir or spec.model.source == "path":
            path = args.model_dir or spec.model.path
            assert path is not None  # the spec requires one with source path
            model_dir = check_model_dir(path)
            name = model_dir.name
        else:  # the built-in architecture; its weights do not change its speed
            model_dir, name = build_tiny_model(Path(tmp) / "model", spec.model.seed, args.size), f"builtin-{args.size}"
        device = spec.trainer.device
        # The policy as the trainer holds it: its named parameters are the version a replica loads.
        model = load_model(model_dir, spec.model.dtype, device)
        num_params = sum(p.numel() for p in model.parameters())
        engine = setup_engine(pool.engine, str(model_dir), spec.model.dtype, eos_token_id(model_dir),
                              threads=args.threads)
        generation = measure_generation(engine, batch_sizes, args.steps, args.prompt_tokens,
                                        long_context=args.prompt_tokens + spec.algorithm.max_new_tokens,
                                        weights={n: p.detach().clone() for n, p in model.named_parameters()},
                                        thread=compute_thread)
        vocab_size = model.config.vocab_size
        training = measure_training(model, spec.algorithm, device, spec.model.dtype, args.prompt_tokens,
                                    completion_tokens, args.train_steps, spec.trainer.weight_chunk_bytes,
                                    thread=compute_thread)
        tok = load_tokenizer(model_dir)
        # the ignores: transformers types a tokenizer's ids loosely (special-token ids; decode of one sequence)
        prompts: list[tuple[tuple[int, ...], str]] = [
            ((tok.bos_token_id, *tok(p.text, add_special_tokens=False)["input_ids"]), p.answer)  # pyright: ignore[reportAssignmentType]
            for p in load_prompts(spec.task)[:spec.algorithm.prompts_per_step]]
        scorer = sample_scorer(spec.reward.function,
                               lambda ids: tok.decode(ids, skip_special_tokens=True))  # pyright: ignore[reportArgumentType]
        queue_factor = spec.generators.dispatch.effective_queue_factor
        samples = measure_samples(scorer, spec.algorithm, vocab_size, prompts, completion_tokens,
                                  generation.max_batch_size, queue_factor, step_s=generation.ptl[-1][1])
        colocated_s = measure_serving(engine, coordinator_for(scorer, spec.algorithm, vocab_size, queue_factor),
                                      prompts, spec.algorithm.group_size, compute_thread)
        del engine
        shape = ModelShape.from_hf_config(model_dir, name=name)
        if not (args.model_dir or spec.model.source == "path"):
            shape = shape.model_copy(update={"source": f"streamrl/models.py ({args.size})"})
    cuda = pool.engine.device.startswith("cuda")
    processor = torch.cuda.get_device_name() if cuda else _cpu_name()
    profile = Profile(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        hardware=ProfileHardware(device=pool.engine.device, name=processor, gpu_type=gpu_type, threads=args.threads,
                                 cores=len(os.sched_getaffinity(0)), torch_version=torch.__version__),
        model=ProfileModel(name=name, num_params=num_params or shape.num_params, dtype=spec.model.dtype,
                           shape=shape),
        engine=ProfileEngine(type=pool.engine.type, max_batch_size=generation.max_batch_size,
                             device=pool.engine.device),
        ptl=generation.ptl, ptl_context=generation.ptl_context, ptl_long_context=generation.long_context,
        ptl_context_s_per_token=generation.context_s_per_token, prefill_s_per_token=generation.prefill_s_per_token,
        prefill_s_per_step=generation.prefill_s_per_step,
        train_micro_batch_size=training.micro_batch_size, train_sequence_tokens=training.sequence_tokens,
        forward_backward_s_per_token=training.forward_backward_s_per_token,
        forward_backward_s_per_micro_batch=training.forward_backward_s_per_micro_batch,
        optimizer_step_s=training.optimizer_step_s, publish_s=training.publish_s,
        weight_load_s=generation.weight_load_s, sample_intake_s=samples.intake_s, sample_stream_s=samples.stream_s,
        sample_stream_receive_s=samples.receive_s,
        sample_colocated_s=colocated_s, cache_release_s=generation.cache_release_s,
        cache_allocate_s=generation.cache_allocate_s)
    out.parent.mkdir(parents=True, exist_ok=True)
    profile.write(out)
    plot = plot_ptl(profile, Path(args.plot) if args.plot else out.with_suffix(".png"))
    print("PTL(BS) ms per decode step: " + ", ".join(f"{b}: {s * 1e3:.2f}" for b, s in profile.ptl)
          + f" (context {profile.ptl_context}; +{profile.ptl_context_s_per_token * 1e9:.1f} ns per sequence per "
          f"context token, measured to {profile.ptl_long_context})")
    print(f"prefill {profile.prefill_s_per_step * 1e3:.2f} ms per admitting step + "
          f"{profile.prefill_s_per_token * 1e6:.1f} us/token; forward/backward "
          f"{profile.forward_backward_s_per_micro_batch * 1e3:.2f} ms per micro-batch + "
          f"{profile.forward_backward_s_per_token * 1e6:.1f} us per padded token (micro-batch "
          f"{training.micro_batch_size}); optimizer step {profile.optimizer_step_s * 1e3:.1f} ms; publish "
          f"{profile.publish_s * 1e3:.1f} ms; weight load {profile.weight_load_s * 1e3:.1f} ms; colocated KV cache "
          f"release {profile.cache_release_s * 1e3:.2f} ms, allocation {profile.cache_allocate_s * 1e3:.2f} ms")
    print(f"per sample: intake {profile.sample_intake_s * 1e6:.1f} us in process, "
          f"{profile.sample_stream_s * 1e6:.1f} us over the Connect stream (sending "
          f"{profile.sample_send_s() * 1e6:.1f} us, receiving {profile.sample_receive_s() * 1e6:.1f} us), "
          f"{profile.sample_colocated_s * 1e6:.1f} us serving colocated beside the engine's steps")
    print(f"profile: {out}\nplot: {plot}")
    return 0


def cmd_simulate(args) -> int:
    from streamrl.simulation.scenario import load_scenario
    from streamrl.simulation.simulator import simulate, write_run

    path = Path(args.scenario)
    scenario = load_scenario(path, args.mode, args.policy, args.iterations)
    run = simulate(scenario, base=path.parent)
    print(run.summary.table())
    if args.out:
        for written in write_run(run, Path(args.out), args.gantt_rows):
            print(written)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrl", description="Disaggregated RL post-training of LLMs.")
    parser.add_argument("--log-level", default=os.environ.get("STREAMRL_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run an RLJob on this machine (trainer + generators as local processes)",
                       description="Run an RLJob on this machine. An --out that already holds a run of this job "
                                   "goes on from it: a run stopped early resumes from its newest checkpoint; a "
                                   "completed run (summary Succeeded, final model written) is left as it is: the "
                                   "command says where its results are and exits 0 without starting anything, also "
                                   "when the job asks for fewer iterations than it trained; a larger "
                                   "algorithm.numIterations continues it from its last checkpoint with the extra "
                                   "iterations. A checkpoint of another job (model, batch shape, seed or task "
                                   "changed) is refused by the trainer. --fresh starts over beside it.")
    p.add_argument("job", help="RLJob YAML file")
    p.add_argument("--out", help="run directory (default: runs/<name>-<time>); one holding a run of this job is "
                                 "resumed, continued or reported complete (see above)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--fresh", action="store_true",
                   help="start over: when --out holds a run, use a new directory beside it (<out>-2, ...); "
                        "without it, a run directory with checkpoints is resumed, or continued, or left as it is "
                        "when complete")
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

    p = sub.add_parser("fetch", help="put the job's model and task file where the trainer finds them (hf "
                                     "downloads into the Hugging Face cache; the built-in model built) and print "
                                     "their paths: the trainer pods' init container")
    p.add_argument("job", help="RLJob YAML file")
    p.add_argument("--progress-every", type=float, default=10.0, metavar="SECONDS",
                   help="how often a download says how many bytes it has (default 10; the operator shows the "
                        "last such line in the job's status)")
    p.set_defaults(fn=cmd_fetch)

    p = sub.add_parser("render", help="print, as multi-document YAML, every object the operator creates for each "
                                      "RLJob (its own builders; for kubectl apply --dry-run=server -f - or a GitOps "
                                      "diff); exit 1 when any job has a problem")
    p.add_argument("files", nargs="+", metavar="FILE", help="RLJob YAML files (other kinds in them are skipped)")
    p.add_argument("--namespace", "-n", default="default", help="the namespace the job would be created in")
    p.set_defaults(fn=cmd_render)

    p = sub.add_parser("report", help="plots and a Markdown summary of a run directory")
    p.add_argument("run_dir", help="a run directory (what `streamrl run --out` wrote)")
    p.add_argument("--out", help="where to write the report (default: <run_dir>/report)")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("profile", help="measure this job's model on this machine for the planner: PTL(BS), prefill "
                                       "and training seconds, the optimizer step, publishing, weight loads, "
                                       "each sample's intake")
    p.add_argument("job", help="RLJob YAML file (its model, engine, micro-batch size and dtype)")
    p.add_argument("--out", required=True, help="the profile file (JSON) to write")
    p.add_argument("--plot", help="PNG of PTL(BS) (default: --out with .png)")
    p.add_argument("--gpu-type", help="the catalog GPU type this machine is: the planner then uses this profile for it")
    p.add_argument("--pool", help="the generator pool whose engine to measure (default: the first)")
    p.add_argument("--size", choices=["tiny", "small"], default="tiny",
                   help="built-in model's size when the job trains builtin-tiny (default tiny)")
    p.add_argument("--model-dir", help="a Hugging Face model directory to measure instead of the job's model")
    p.add_argument("--batch-sizes", help="PTL batch sizes, comma-separated (default: what a replica measures: "
                                         "powers of two up to the engine's maxBatchSize)")
    p.add_argument("--steps", type=int, default=4, help="decode steps timed per batch size (default 4)")
    p.add_argument("--prompt-tokens", type=int, default=32, help="prompt tokens of prefill and training (default 32)")
    p.add_argument("--completion-tokens", type=int,
                   help="completion tokens of each trained sample (default: algorithm.maxNewTokens)")
    p.add_argument("--train-steps", type=int, default=5,
                   help="rounds of one timed step of every micro-batch shape in turn, after a warm-up round; "
                        "each shape's median kept (default 5: with 2, the fitted seconds per token moved 20%% "
                        "between profiles taken minutes apart)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.set_defaults(fn=cmd_profile)

    p = sub.add_parser("plan", help="size a job before renting GPUs: per stage the GPU type and count, the "
                                    "generators' tensor-parallel size and replicas, so generation keeps up with "
                                    "training (docs/planning.md)")
    p.add_argument("job", help="RLJob YAML file (model, algorithm, batch, pipeline mode)")
    p.add_argument("--gpus", action="append", metavar="[DC:]TYPE=N[,TYPE=N]",
                   help="GPUs available, by catalog type (repeatable; two datacenter names = two datacenters)")
    p.add_argument("--objective", choices=["time", "cost"], default="time",
                   help="minimise iteration time (default) or maximise samples/s per cost")
    p.add_argument("--lengths", help="output lengths of a previous run (its lengths.jsonl)")
    p.add_argument("--lognormal", metavar="MU,SIGMA", help="output lengths: ln(length) ~ Normal(MU, SIGMA)")
    p.add_argument("--max-length", type=int, help="longest output, tokens (default: algorithm.maxNewTokens)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="mean prompt length, tokens (default 512)")
    p.add_argument("--model", help="model shape: a catalog name (deploy/catalog/models.yaml), a config.json or a "
                                   "model directory (default: the job's model)")
    p.add_argument("--algorithm", choices=["grpo", "ppo"],
                   help="training passes: grpo (policy; a reference forward when klCoef > 0) or ppo (plus a critic); "
                        "default: the job's algorithm.type")
    p.add_argument("--profile", action="append", metavar="[TYPE=]FILE",
                   help="a measured profile (streamrl profile) replaces the roofline for its GPU type (repeatable)")
    p.add_argument("--catalog", action="append", metavar="DIR",
                   help="a folder of catalog YAML files added to deploy/catalog (repeatable)")
    p.add_argument("--assumptions", metavar="FILE",
                   help="YAML of the roofline's assumed constants to change (docs/planning.md lists them)")
    p.add_argument("--calibrate", metavar="PROFILE",
                   help="fit the roofline's efficiency factors to a profile measured on a catalog GPU type")
    p.add_argument("--network-gb-s", type=float, default=25.0, help="weight transfer within a datacenter, GB/s")
    p.add_argument("--cross-dc-gb-s", type=float, default=1.25, help="weight transfer between datacenters, GB/s")
    p.add_argument("--cross-dc-latency-s", type=float, default=0.05, help="round trip between datacenters, s")
    p.add_argument("--tolerance", type=float, default=0.01,
                   help="iteration times within this fraction of the best count as equal; the cheaper plan wins")
    p.add_argument("--cluster-ref", action="append", metavar="DC=RLCLUSTER",
                   help="the RLCluster of a datacenter other than the trainer's (default: its name)")
    p.add_argument("--out", help="write the job with the plan filled in here (kubectl apply -f takes it)")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("simulate", help="simulate a run as discrete events at any scale, the product's own dispatch "
                                        "and scaling code deciding: samples/s, bubbles, utilisation, cost, a Gantt "
                                        "chart (deploy/scenarios/)")
    p.add_argument("scenario", help="scenario YAML file (deploy/scenarios/README.md describes the format)")
    p.add_argument("--mode", choices=["colocated", "batch", "stream-sync", "stream-async"],
                   help="pipeline mode instead of the scenario's")
    p.add_argument("--policy", choices=["random-fifo", "skewness-aware", "oracle"],
                   help="dispatch policy instead of the scenario's")
    p.add_argument("--iterations", type=int, help="iterations instead of the scenario's")
    p.add_argument("--out", help="write simulation.json, iterations.jsonl and gantt.png here")
    p.add_argument("--gantt-rows", type=int, default=24, help="generator rows drawn in the Gantt chart (default 24)")
    p.set_defaults(fn=cmd_simulate)

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
    p.add_argument("--preempted-exit-code", type=int, default=0,
                   help="exit status after SIGTERM (phase Preempted, a checkpoint written; default 0). A Job "
                        "that must not count a preempted trainer as done sets another (the operator: 75)")
    p.set_defaults(fn=cmd_trainer)

    p = sub.add_parser("generator", help="serve one generator replica that dials the trainer")
    p.add_argument("job", help="RLJob YAML file")
    p.add_argument("--trainer", required=True, help="trainer gRPC address host:port")
    p.add_argument("--pool", default="default", help="generator pool of this replica")
    p.add_argument("--id", help="replica id (default: <pool>-<host>-<pid>)")
    p.add_argument("--model-dir", help="load the initial policy from this directory (default: boot from the "
                                       "trainer: its config and tokenizer over FetchModel, its current weights "
                                       "as a version)")
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
    _setup_logging(args.log_level, offline=args.fn is not cmd_fetch)
    from streamrl.spec import SpecError

    try:
        return args.fn(args)
    except (SpecError, ValueError) as err:
        print(f"streamrl {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
