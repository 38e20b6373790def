import threading

import grpc
import pytest
import torch

from streamrl.samples import WeightsNotice
from streamrl.transfer import fetch_blob
from streamrl.v1 import rollout_pb2 as pb
from streamrl.weights import WeightsCorruptError, WeightVersion, deserialize, serialize


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code=grpc.StatusCode.UNAVAILABLE):
        self._code = code

    def code(self):
        return self._code


class _FakeWeightStub:
    """Serves one version's chunks; the first `breaks` streams fail after `after` chunks."""

    def __init__(self, version: WeightVersion, breaks: int, after: int, corrupt_at: int | None = None):
        self.version, self.breaks, self.after, self.corrupt_at = version, breaks, after, corrupt_at
        self.offsets: list[int] = []

    def FetchWeights(self, request):
        self.offsets.append(request.offset_bytes)
        for i, (offset, view, sha) in enumerate(self.version.chunks(request.offset_bytes)):
            data = bytes(view)
            if len(self.offsets) <= self.breaks and i == self.after:
                raise _FakeRpcError()
            if offset == self.corrupt_at:
                data = b"\0" + data[1:]
            yield pb.FetchWeightsResponse(policy_version=self.version.policy_version, offset_bytes=offset,
                                          data=data, sha256=sha, size_bytes=self.version.size_bytes)


def _version():
    g = torch.Generator().manual_seed(0)
    tensors = {"w": torch.randn(100, 50, generator=g)}
    return tensors, WeightVersion.build(4, serialize(tensors), 1024)


def _notice(v: WeightVersion) -> WeightsNotice:
    return WeightsNotice(v.policy_version, v.size_bytes, v.num_chunks, v.sha256)


def test_broken_transfer_resumes_from_the_last_verified_chunk():
    tensors, version = _version()
    stub = _FakeWeightStub(version, breaks=2, after=3)
    got = deserialize(fetch_blob(stub, _notice(version), backoff_s=0.0))
    assert stub.offsets == [0, 3 * 1024, 6 * 1024]
    assert torch.equal(got["w"], tensors["w"])


def test_transfer_gives_up_after_bounded_attempts():
    _, version = _version()
    stub = _FakeWeightStub(version, breaks=100, after=0)
    with pytest.raises(grpc.RpcError):
        fetch_blob(stub, _notice(version), max_attempts=3, backoff_s=0.0)
    assert len(stub.offsets) == 3


def test_corrupt_chunk_aborts_the_transfer():
    _, version = _version()
    stub = _FakeWeightStub(version, breaks=0, after=0, corrupt_at=2 * 1024)
    with pytest.raises(WeightsCorruptError, match="offset 2048 fails its checksum"):
        fetch_blob(stub, _notice(version), backoff_s=0.0)


def test_no_retry_once_the_agent_is_stopping():
    _, version = _version()
    stub = _FakeWeightStub(version, breaks=1, after=1)
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(grpc.RpcError):
        fetch_blob(stub, _notice(version), backoff_s=0.0, stopping=stopping)
    assert len(stub.offsets) == 1


def test_hand_encoded_chunks_parse_like_protobuf_both_ways():
    from streamrl.transfer import decode_chunk, encode_chunk

    _, version = _version()
    for offset, data, sha in version.chunks():
        wire = encode_chunk(version, offset, data, sha)
        msg = pb.FetchWeightsResponse.FromString(wire)
        assert (msg.policy_version, msg.offset_bytes, msg.data, msg.sha256, msg.size_bytes) == \
               (4, offset, bytes(data), sha, version.size_bytes)
        assert wire == msg.SerializeToString()  # canonical: byte-identical to protobuf's own
        back = decode_chunk(msg.SerializeToString())
        assert (back.policy_version, back.offset_bytes, bytes(back.data), back.sha256, back.size_bytes) == \
               (4, offset, bytes(data), sha, version.size_bytes)


def test_decoder_rejects_truncated_messages():
    from streamrl.transfer import decode_chunk, encode_chunk

    _, version = _version()
    offset, data, sha = next(version.chunks(1024))
    wire = encode_chunk(version, offset, data, sha)
    with pytest.raises(WeightsCorruptError, match="truncated"):
        decode_chunk(wire[:-1] + b"\x80")
