"""The records one component writes and another reads: a scaling round's line, built once for
the local autoscaler and the simulated one."""

from streamrl.records import ScalingRecord
from streamrl.scaling.policy import Decision, Observation


def test_a_scaling_record_of_a_round_rounds_as_autoscaling_jsonl_holds_it(tmp_path):
    decision = Decision(replicas={"l4": 3, "a100": 2}, reason="generation-bound", step=1, pool="l4")
    observation = Observation(generation_s=12.345678, train_s=9.87654321, idle_no_work=0.0123456)
    record = ScalingRecord.of(decision, observation, window_s=61.26, now=1700000000.12345)
    assert record == ScalingRecord(time_unix=1700000000.123, step=1, pool="l4", replicas={"l4": 3, "a100": 2},
                                   reason="generation-bound", trainer_bound=False, generation_s=12.3457,
                                   train_s=9.8765, idle_no_work=0.0123, window_s=61.3)
    path = tmp_path / "autoscaling.jsonl"
    path.write_text(record.to_json() + "\n")
    assert ScalingRecord.read_lines(path) == [record]
