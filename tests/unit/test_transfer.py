import threading

import grpc
import pytest
import torch

from streamrl.transfer import fetch_blob
from streamrl.samples import WeightsNotice
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
        for i, (offset, data, sha) in enumerate(self.version.chunks(request.offset_bytes)):
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
