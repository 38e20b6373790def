"""The FetchWeights codec: FetchWeightsResponse messages encoded and decoded by hand, so a
weight chunk is copied once on the way out and never on the way in (protobuf's own message
objects would copy each chunk twice more; at weight sizes those copies are most of the cost).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from streamrl.weights import WeightsCorruptError


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


class VersionHeader(Protocol):
    """What a chunk's message repeats of its version: a WeightVersion's, or a relay's Incoming's."""

    @property
    def policy_version(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...


def encode_chunk(version: VersionHeader, offset: int, data: memoryview, sha256: str) -> bytes:
    """A FetchWeightsResponse in protobuf wire format, built with a single copy of the
    chunk (constructing the message and serializing it would copy it twice more; at
    weight sizes those copies are most of the cost). Fields in number order, zeros omitted,
    as protobuf itself writes them."""
    parts = []
    for tag, value in ((0x08, version.policy_version), (0x10, offset)):
        if value:
            parts += [bytes((tag,)), _varint(value)]
    parts += [b"\x1a", _varint(len(data)), data, b"\x22", _varint(len(sha256)), sha256.encode()]
    if version.size_bytes:
        parts += [b"\x28", _varint(version.size_bytes)]
    return b"".join(parts)


class Chunk(NamedTuple):
    """A decoded FetchWeightsResponse whose data is a view into the received message."""

    policy_version: int
    offset_bytes: int
    data: memoryview
    sha256: str
    size_bytes: int


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise WeightsCorruptError("truncated FetchWeightsResponse")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def decode_chunk(buf: bytes) -> Chunk:
    """Parse FetchWeightsResponse wire bytes without copying the chunk (protobuf's parser
    plus `.data` would copy it twice); unknown fields are skipped."""
    view = memoryview(buf)
    fields: dict[int, Any] = {}  # by field number: an int (varint) or a memoryview (length-delimited)
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            fields[number], i = _read_varint(buf, i)
        elif wire_type == 2:
            n, i = _read_varint(buf, i)
            fields[number] = view[i : i + n]
            i += n
        elif wire_type in (1, 5):
            i += 8 if wire_type == 1 else 4
        else:
            raise WeightsCorruptError(f"malformed FetchWeightsResponse (wire type {wire_type})")
    if i != len(buf):
        raise WeightsCorruptError("truncated FetchWeightsResponse")
    return Chunk(fields.get(1, 0), fields.get(2, 0), fields.get(3, view[0:0]),
                 bytes(fields.get(4, b"")).decode("ascii", "replace"), fields.get(5, 0))
