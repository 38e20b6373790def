"""Weight transfer: resume from the last verified chunk, bounded attempts, corrupt chunks
refused, and the hand-written codec byte-identical to protobuf's."""

import asyncio

import grpc
import pytest
import torch

from streamrl.messages import WeightsNotice
from streamrl.v1 import rollout_pb2 as pb
from streamrl.weights import WeightsCorruptError, WeightVersion, deserialize, serialize
from streamrl.wire.codec import decode_chunk, encode_chunk
from streamrl.wire.transfer import fetch_blob


class _FakeWeightSource:
    """Serves one version's chunks; the first `breaks` streams fail after `after` chunks."""

    def __init__(self, version: WeightVersion, breaks: int, after: int, corrupt_at: int | None = None):
        self.version, self.breaks, self.after, self.corrupt_at = version, breaks, after, corrupt_at
        self.offsets: list[int] = []

    async def fetch(self, policy_version: int, offset_bytes: int):
        self.offsets.append(offset_bytes)
        for i, (offset, view, sha) in enumerate(self.version.chunks(offset_bytes)):
            data = bytes(view)
            if len(self.offsets) <= self.breaks and i == self.after:
                raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata())
            if offset == self.corrupt_at:
                data = b"\0" + data[1:]
            yield decode_chunk(encode_chunk(self.version, offset, memoryview(data), sha))


def _version():
    g = torch.Generator().manual_seed(0)
    tensors = {"w": torch.randn(100, 50, generator=g)}
    return tensors, WeightVersion.build(4, serialize(tensors), 1024)


def _notice(v: WeightVersion) -> WeightsNotice:
    return WeightsNotice(v.policy_version, v.size_bytes, v.num_chunks, v.sha256)


async def test_broken_transfer_resumes_from_the_last_verified_chunk():
    tensors, version = _version()
    stub = _FakeWeightSource(version, breaks=2, after=3)
    got = deserialize(await fetch_blob(stub, _notice(version), backoff_s=0.0))
    assert stub.offsets == [0, 3 * 1024, 6 * 1024]
    assert torch.equal(got["w"], tensors["w"])


async def test_transfer_gives_up_after_bounded_attempts():
    _, version = _version()
    stub = _FakeWeightSource(version, breaks=100, after=0)
    with pytest.raises(grpc.aio.AioRpcError):
        await fetch_blob(stub, _notice(version), max_attempts=3, backoff_s=0.0)
    assert len(stub.offsets) == 3


async def test_corrupt_chunk_aborts_the_transfer():
    _, version = _version()
    stub = _FakeWeightSource(version, breaks=0, after=0, corrupt_at=2 * 1024)
    with pytest.raises(WeightsCorruptError, match="offset 2048 fails its checksum"):
        await fetch_blob(stub, _notice(version), backoff_s=0.0)


async def test_no_retry_once_the_agent_is_stopping():
    _, version = _version()
    stub = _FakeWeightSource(version, breaks=1, after=1)
    stopping = asyncio.Event()
    stopping.set()
    with pytest.raises(grpc.aio.AioRpcError):
        await fetch_blob(stub, _notice(version), backoff_s=0.0, stopping=stopping)
    assert len(stub.offsets) == 1


def test_hand_encoded_chunks_parse_like_protobuf_both_ways():
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
    _, version = _version()
    offset, data, sha = next(version.chunks(1024))
    wire = encode_chunk(version, offset, data, sha)
    with pytest.raises(WeightsCorruptError, match="truncated"):
        decode_chunk(wire[:-1] + b"\x80")
