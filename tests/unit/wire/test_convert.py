"""Domain <-> wire conversion of a Sample, through the bytes of a ConnectRequest."""

from streamrl.samples import Sample, VersionRun
from streamrl.v1 import rollout_pb2 as pb
from streamrl.wire.convert import request_from_pb, request_to_pb

ONE_VERSION = Sample("3-0-17", 2, (7, 8, 2), (-0.5, -1.5, -0.25), 4, "stop", "g0", 0.5, 1.25, 3)


def _through_the_wire(sample: Sample) -> Sample:
    data = request_to_pb(sample).SerializeToString()
    return request_from_pb(pb.ConnectRequest.FromString(data), "g0")


def test_a_sample_of_one_version_round_trips_without_runs():
    assert _through_the_wire(ONE_VERSION) == ONE_VERSION
    assert len(request_to_pb(ONE_VERSION).sample.version_runs) == 0


def test_the_versions_of_an_in_flight_samples_tokens_round_trip():
    mixed = Sample("3-0-17", 2, (7, 8, 2, 9, 9), (-0.5,) * 5, 4, "length", "g0", 0.5, 1.25, 3,
                   version_runs=(VersionRun(4, 1), VersionRun(5, 3), VersionRun(7, 1)))
    wire = request_to_pb(mixed).sample
    assert [(r.policy_version, r.num_tokens) for r in wire.version_runs] == [(4, 1), (5, 3), (7, 1)]
    back = _through_the_wire(mixed)
    assert back == mixed
    assert (back.num_versions, back.newest_version) == (3, 7)


def test_a_sender_that_knows_no_runs_is_read_as_one_version():
    """A generator built before version_runs existed sends none: its samples are of one version."""
    old = pb.Sample(prompt_id="p", sample_index=0, completion_token_ids=[5, 2], logprobs=[-1.0, -2.0],
                    policy_version=6, finish_reason=pb.FINISH_REASON_STOP)
    sample = request_from_pb(pb.ConnectRequest(sample=old), "g0")
    assert (sample.version_runs, sample.num_versions, sample.newest_version) == ((), 1, 6)
