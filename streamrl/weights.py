"""Versioned policy weights as checksummed chunks: what the trainer publishes and a
generator reassembles. Knows bytes and tensors; the gRPC transfer lives in the services."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class WeightsCorruptError(ValueError):
    """A chunk or a whole version failed its checksum; nothing of it may be used."""


def serialize(named_tensors: dict[str, torch.Tensor]) -> bytes:
    """safetensors bytes of CPU, contiguous copies of the tensors."""
    from safetensors.torch import save

    return save({k: v.detach().to("cpu").contiguous() for k, v in named_tensors.items()})


def deserialize(blob: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(blob)


def version_digest(chunk_sha256: list[str] | tuple[str, ...]) -> str:
    """The whole-version digest from the per-chunk hex digests, in order."""
    return hashlib.sha256(b"".join(bytes.fromhex(h) for h in chunk_sha256)).hexdigest()


@dataclass(frozen=True)
class WeightVersion:
    policy_version: int
    blob: bytes
    chunk_bytes: int
    sha256: str
    """The version's digest: hex SHA-256 over the concatenated per-chunk SHA-256 digests
    (a one-level hash list: checking every chunk against its digest and the digests
    against this value verifies the whole blob without a second pass over it)."""
    chunk_sha256: tuple[str, ...]
    """Hex SHA-256 of each chunk, in order."""

    @classmethod
    def build(cls, policy_version: int, blob: bytes, chunk_bytes: int) -> WeightVersion:
        view = memoryview(blob)
        hashes = tuple(
            hashlib.sha256(view[o : o + chunk_bytes]).hexdigest() for o in range(0, max(len(blob), 1), chunk_bytes)
        )
        return cls(policy_version, blob, chunk_bytes, version_digest(hashes), hashes)

    @property
    def size_bytes(self) -> int:
        return len(self.blob)

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_sha256)

    def chunks(self, offset_bytes: int = 0) -> Iterator[tuple[int, memoryview, str]]:
        """(offset, data, sha256) from offset_bytes, which must be a chunk boundary (checked
        now, not at the first chunk); data is a view into the blob (no copy)."""
        if offset_bytes % self.chunk_bytes or offset_bytes > self.size_bytes:
            raise ValueError(f"offset_bytes {offset_bytes} is not a chunk boundary of version {self.policy_version}")
        view = memoryview(self.blob)
        return ((i * self.chunk_bytes, view[i * self.chunk_bytes : (i + 1) * self.chunk_bytes], self.chunk_sha256[i])
                for i in range(offset_bytes // self.chunk_bytes, self.num_chunks))


class WeightStore:
    """The latest `keep` versions, oldest evicted first (bounded memory)."""

    def __init__(self, keep: int, chunk_bytes: int):
        self.keep = keep
        self.chunk_bytes = chunk_bytes
        self._versions: OrderedDict[int, WeightVersion] = OrderedDict()

    def publish(self, policy_version: int, named_tensors: dict[str, torch.Tensor]) -> WeightVersion:
        version = WeightVersion.build(policy_version, serialize(named_tensors), self.chunk_bytes)
        self.add(version)
        return version

    def add(self, version: WeightVersion) -> None:
        self._versions[version.policy_version] = version
        while len(self._versions) > self.keep:
            self._versions.popitem(last=False)

    def get(self, policy_version: int) -> WeightVersion | None:
        return self._versions.get(policy_version)

    @property
    def latest(self) -> WeightVersion | None:
        return next(reversed(self._versions.values()), None)


class WeightAssembler:
    """Reassembles one version from verified chunks; `next_offset` is where to resume."""

    def __init__(self, policy_version: int, size_bytes: int, sha256: str):
        self.policy_version = policy_version
        self.size_bytes = size_bytes
        self.sha256 = sha256
        self._parts: list[bytes | memoryview] = []
        self._digests: list[str] = []
        self.next_offset = 0

    def add_chunk(self, offset_bytes: int, data: bytes | memoryview, sha256: str) -> None:
        if offset_bytes != self.next_offset:
            raise WeightsCorruptError(
                f"version {self.policy_version}: chunk at offset {offset_bytes}, expected {self.next_offset}"
            )
        if hashlib.sha256(data).hexdigest() != sha256:
            raise WeightsCorruptError(
                f"version {self.policy_version}: chunk at offset {offset_bytes} fails its checksum")
        self._parts.append(data)
        self._digests.append(sha256)
        self.next_offset += len(data)

    @property
    def complete(self) -> bool:
        return self.next_offset >= self.size_bytes

    def finish(self) -> bytes:
        """The serialized version, once every byte is in and the whole-version checksum matches."""
        if self.next_offset != self.size_bytes:
            raise WeightsCorruptError(f"version {self.policy_version}: {self.next_offset} of {self.size_bytes} bytes")
        if version_digest(self._digests) != self.sha256:
            raise WeightsCorruptError(f"version {self.policy_version}: whole-version checksum mismatch")
        return b"".join(self._parts)
