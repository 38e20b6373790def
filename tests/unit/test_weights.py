import pytest
import torch

from streamrl.weights import WeightAssembler, WeightsCorruptError, WeightStore, WeightVersion, deserialize, serialize


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(64, 33, generator=g), "b.bias": torch.randn(7, generator=g),
            "c": torch.arange(10, dtype=torch.int64)}


def test_chunked_round_trip_gives_identical_tensors():
    store = WeightStore(keep=2, chunk_bytes=1024)
    version = store.publish(3, _tensors())
    assert version.num_chunks == -(-version.size_bytes // 1024) > 4
    asm = WeightAssembler(3, version.size_bytes, version.sha256)
    for offset, data, sha in version.chunks():
        asm.add_chunk(offset, data, sha)
    got = deserialize(asm.finish())
    for name, t in _tensors().items():
        assert torch.equal(got[name], t)


def test_resume_from_a_chunk_boundary_completes_the_same_version():
    version = WeightVersion.build(1, serialize(_tensors()), 1000)
    asm = WeightAssembler(1, version.size_bytes, version.sha256)
    for i, (offset, data, sha) in enumerate(version.chunks()):
        if i == 3:
            break  # the stream broke here
        asm.add_chunk(offset, data, sha)
    for offset, data, sha in version.chunks(asm.next_offset):
        asm.add_chunk(offset, data, sha)
    assert torch.equal(deserialize(asm.finish())["a.weight"], _tensors()["a.weight"])


def test_corrupt_chunk_is_rejected():
    version = WeightVersion.build(1, serialize(_tensors()), 1000)
    asm = WeightAssembler(1, version.size_bytes, version.sha256)
    offset, data, sha = next(version.chunks())
    flipped = bytes([data[0] ^ 0xFF]) + data[1:]
    with pytest.raises(WeightsCorruptError, match="offset 0 fails its checksum"):
        asm.add_chunk(offset, flipped, sha)
    assert asm.next_offset == 0


def test_whole_version_checksum_catches_consistent_forgery():
    version = WeightVersion.build(1, serialize(_tensors()), 1000)
    forged = WeightVersion.build(1, serialize(_tensors(seed=1)), 1000)
    asm = WeightAssembler(1, version.size_bytes, version.sha256)  # expects the real version
    for offset, data, sha in forged.chunks():
        asm.add_chunk(offset, data, sha)
    with pytest.raises(WeightsCorruptError, match="whole-version checksum"):
        asm.finish()


def test_out_of_order_and_misaligned_chunks_are_refused():
    version = WeightVersion.build(1, serialize(_tensors()), 1000)
    asm = WeightAssembler(1, version.size_bytes, version.sha256)
    chunks = list(version.chunks())
    with pytest.raises(WeightsCorruptError, match="expected 0"):
        asm.add_chunk(*chunks[1])
    with pytest.raises(ValueError, match="not a chunk boundary"):
        list(version.chunks(10))


def test_store_keeps_only_the_latest_versions():
    store = WeightStore(keep=2, chunk_bytes=4096)
    for v in range(4):
        store.publish(v, _tensors(v))
    assert store.get(0) is None and store.get(1) is None
    assert store.get(3).policy_version == 3 and store.latest.policy_version == 3
