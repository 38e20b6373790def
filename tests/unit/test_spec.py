import pytest
from pydantic import ValidationError

from streamrl.spec import API_VERSION, RLJob, SpecError, dump_job, load_job, parse_job
from tests.conftest import EXAMPLE


def _job(**spec):
    spec = {"model": {"source": "builtin-tiny"}, **spec}
    return {"apiVersion": "streamrl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "t"}, "spec": spec}


def test_example_job_loads_with_its_values():
    job = load_job(EXAMPLE)
    assert job.metadata.name == "tiny-counting"
    assert job.spec.pipeline.mode.value == "stream-sync"
    assert job.spec.algorithm.group_size == 8
    assert job.spec.generators.pools[0].engine.max_batch_size == 64


def test_dump_then_parse_round_trips():
    job = load_job(EXAMPLE)
    import yaml

    assert parse_job(yaml.safe_load(dump_job(job))) == job


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"algorithm": {"groupSize": 0}}, "spec.algorithm.groupSize: Input should be greater than or equal to 1"),
        ({"algorithm": {"groupSize": 1}}, "spec.algorithm.groupSize: 1 sample per prompt leaves grpo nothing to "
                                          "compare a sample with"),
        ({"algorithm": {"learningRate": 0}}, "spec.algorithm.learningRate: Input should be greater than 0"),
        ({"algorithm": {"topP": 1.5}}, "spec.algorithm.topP: Input should be less than or equal to 1"),
        ({"algorithm": {"groupsize": 4}}, "spec.algorithm.groupsize: unknown field"),
        ({"pipeline": {"mode": "fast"}},
         "spec.pipeline.mode: Input should be 'colocated', 'batch', 'stream-sync' or 'stream-async'"),
        ({"model": {"source": "path"}}, "spec.model: path is required when source is 'path'"),
        ({"task": {"name": "jsonl"}}, "spec.task: path, hf or pvc is required when name is 'jsonl'"),
        ({"generators": {"pools": [{"name": "a"}, {"name": "a"}]}},
         "spec.generators: pool names must be unique; repeated: a"),
        ({"generators": {"pools": [{"name": "Bad_Name"}]}},
         "spec.generators.pools[0].name: String should match pattern"),
        ({"generators": {"dispatch": {"queueFactor": 0.5}}},
         "spec.generators.dispatch.queueFactor: Input should be greater than or equal to 1"),
        ({"generators": {"pools": [{"engine": {"type": "tpu"}}]}}, "spec.generators.pools[0].engine: Input tag 'tpu'"),
        ({"generators": {"pools": [{"engine": {"type": "vllm", "maxBatchSize": 8}}]}},
         "spec.generators.pools[0].engine.maxBatchSize: unknown field"),
        ({"generators": {"pools": [{"engine": {"type": "vllm", "maxNumSeqs": 0}}]}},
         "spec.generators.pools[0].engine.maxNumSeqs: Input should be greater than or equal to 1"),
        ({"generators": {"pools": [{"engine": {"type": "vllm", "device": "tpu"}}]}},
         "spec.generators.pools[0].engine.device: Input should be 'cpu' or 'cuda'"),
        ({"generators": {"pools": [{"replicas": 0}]}}, "spec.generators: at least one generator replica is needed"),
        ({"pipeline": {"maxStaleness": 0}}, "spec.pipeline.maxStaleness: Input should be greater than or equal to 1"),
        ({"pipeline": {"inFlightUpdates": True}},
         "spec.pipeline: inFlightUpdates: true needs mode stream-async (mode is stream-sync)"),
        ({"pipeline": {"mode": "colocated", "inFlightUpdates": True}},
         "spec.pipeline: inFlightUpdates: true needs mode stream-async (mode is colocated)"),
        ({"pipeline": {"mode": "stream-async", "inFlightUpdates": "yes"}},
         "spec.pipeline.inFlightUpdates: Input should be a valid boolean"),
        ({"trainer": {"weightChunkBytes": 64 << 20}}, "spec.trainer.weightChunkBytes: Input should be less than"),
    ],
)
def test_invalid_spec_names_the_field_and_the_problem(spec, expected):
    with pytest.raises(SpecError) as err:
        parse_job(_job(**spec), "job.yaml")
    assert expected in str(err.value)
    assert str(err.value).startswith("job.yaml: invalid RLJob")


def test_in_flight_updates_are_off_by_default_and_allowed_in_stream_async():
    assert parse_job(_job()).spec.pipeline.in_flight_updates is False
    pipeline = parse_job(_job(pipeline={"mode": "stream-async", "inFlightUpdates": True})).spec.pipeline
    assert pipeline.in_flight_updates is True


def test_wrong_kind_and_api_version_are_rejected():
    with pytest.raises(SpecError, match="kind: Input should be 'RLJob'"):
        parse_job({"apiVersion": "streamrl.io/v1alpha1", "kind": "Job"})
    with pytest.raises(SpecError, match="apiVersion: Input should be 'streamrl.io/v1alpha1'"):
        parse_job({"apiVersion": "v1", "kind": "RLJob"})


def test_the_api_version_field_is_the_api_version_constant():
    """RLJob writes it out (a Literal takes no variable): the two must not drift apart."""
    assert RLJob.model_fields["api_version"].default == API_VERSION
    assert RLJob.model_fields["api_version"].annotation.__args__ == (API_VERSION,)


def test_a_job_must_say_what_it_trains():
    job = _job()
    del job["spec"]["model"]
    with pytest.raises(SpecError) as err:
        parse_job(job, "job.yaml")
    assert "spec.model: required: a job must say what it trains (e.g. `model: {source: builtin-tiny}`)" in \
        str(err.value)
    with pytest.raises(SpecError, match=r"spec: required: an RLJob must have a spec"):
        parse_job({"apiVersion": "streamrl.io/v1alpha1", "kind": "RLJob"})
    assert parse_job(_job(model={"source": "builtin-tiny"})).spec.model.source == "builtin-tiny"


def test_every_problem_is_reported_at_once():
    with pytest.raises(SpecError) as err:
        parse_job(_job(algorithm={"groupSize": 0, "promptsPerStep": 0}))
    assert "(2 problems)" in str(err.value)


def test_unreadable_and_non_yaml_files_fail_clearly(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_job(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_job(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_job(bad)


def test_spec_is_frozen_and_documented():
    job = RLJob.model_validate({"spec": {"model": {"source": "builtin-tiny"}}})
    with pytest.raises(ValidationError):
        job.spec.algorithm.group_size = 3
    schema = RLJob.model_json_schema(by_alias=True)
    assert schema["$defs"]["AlgorithmSpec"]["properties"]["groupSize"]["description"].startswith("Samples per prompt")
    assert parse_job(_job(algorithm={"type": "ppo", "groupSize": 1})).spec.algorithm.group_size == 1  # its critic


def test_spec_module_imports_neither_torch_nor_grpc():
    import subprocess
    import sys

    code = "import sys, streamrl.spec; print('torch' in sys.modules, 'grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_total_replicas_spread_over_pools_in_proportion():
    from streamrl.spec import GeneratorsSpec

    pools = [{"name": "l4", "replicas": 2}, {"name": "a10", "replicas": 1}]
    assert GeneratorsSpec.model_validate({"pools": pools}).pool_replicas() == {"l4": 2, "a10": 1}
    assert GeneratorsSpec.model_validate({"pools": pools, "replicas": 6}).pool_replicas() == {"l4": 4, "a10": 2}
    # 7 * 2/3 = 4.67, 7 * 1/3 = 2.33: the larger remainder gets the extra replica.
    assert GeneratorsSpec.model_validate({"pools": pools, "replicas": 7}).pool_replicas() == {"l4": 5, "a10": 2}
    assert GeneratorsSpec.model_validate({"pools": pools, "replicas": 1}).pool_replicas() == {"l4": 1, "a10": 0}
    even = [{"name": "a", "replicas": 1}, {"name": "b", "replicas": 1}]
    assert GeneratorsSpec.model_validate({"pools": even, "replicas": 3}).pool_replicas() == {"a": 2, "b": 1}


@pytest.mark.parametrize("dispatch, factor", [
    ({}, 4.0),
    ({"policy": "skewness-aware"}, 1.25),
    ({"policy": "oracle", "oracleLengths": "x.jsonl"}, 1.25),
    ({"policy": "random-fifo", "queueFactor": 1.5}, 1.5),
    ({"policy": "skewness-aware", "queueFactor": 8}, 8.0),
])
def test_ranked_policies_bind_work_late_unless_told(dispatch, factor):
    job = parse_job(_job(generators={"dispatch": dispatch}))
    assert job.spec.generators.dispatch.effective_queue_factor == factor


def test_a_cuda_trainer_needs_a_gpu_per_rank_and_the_world_size_is_nodes_times_processes():
    base = {"model": {"source": "builtin-tiny"}}
    with pytest.raises(SpecError, match=r"spec.trainer.processesPerNode: 4 is more than the GPUs of a trainer pod "
                                        r"\(placement.gpus: 2\)"):
        parse_job({"spec": {**base, "trainer": {"device": "cuda", "processesPerNode": 4, "placement": {"gpus": 2}}}})
    ok = parse_job({"spec": {**base, "trainer": {"device": "cuda", "processesPerNode": 2, "placement": {"gpus": 2},
                                                   "nodes": 3}}})
    assert ok.spec.trainer.world_size == 6
    assert parse_job({"spec": {**base, "trainer": {"processesPerNode": 4}}}).spec.trainer.world_size == 4  # CPU ranks
