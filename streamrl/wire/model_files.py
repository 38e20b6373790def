"""The policy model's files other than its weights (config.json, the tokenizer's files,
generation_config.json...) over FetchModel: read once by the trainer from its model directory
and served in chunks; fetched by a replica that boots from the trainer, each file checked
against its size and SHA-256 and written into a directory of its own. The weights themselves
travel as versions (FetchWeights). Knows files and chunks, not models."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from streamrl.models import WEIGHT_SUFFIXES, is_weight_file
from streamrl.v1 import rollout_pb2 as pb

log = logging.getLogger(__name__)

FETCH_MODEL = "/streamrl.v1.Rollout/FetchModel"
CHUNK_BYTES = 1 << 20
MAX_FILE_BYTES = 256 << 20
"""A non-weight file larger than this is refused when the trainer reads the directory (a
weight file under another name would otherwise be sent to every replica)."""
WAIT_LOG_S = 30.0
"""How often a replica waiting for an unreachable trainer says so in its log."""


@dataclass(frozen=True)
class ModelFile:
    name: str
    data: bytes
    sha256: str


def read_model_files(model_dir: Path) -> list[ModelFile]:
    """The directory's top-level files other than weights, read once; ValueError naming a
    file too large to be anything but weights, or a directory without config.json."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir}: not a Hugging Face model directory (no config.json)")
    files = []
    for path in sorted(p for p in model_dir.iterdir() if p.is_file() and not is_weight_file(p.name)):
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ValueError(f"{path}: {size} bytes is not a config or tokenizer file; weights belong in "
                             f"files ending {', '.join(WEIGHT_SUFFIXES)}")
        data = path.read_bytes()
        files.append(ModelFile(path.name, data, hashlib.sha256(data).hexdigest()))
    return files


def model_responses(files: list[ModelFile]) -> Iterator[pb.FetchModelResponse]:
    """A FetchModel call's stream: each file's chunks in order (an empty file as one empty chunk)."""
    for f in files:
        for offset in range(0, max(1, len(f.data)), CHUNK_BYTES):
            yield pb.FetchModelResponse(name=f.name, size_bytes=len(f.data), sha256=f.sha256, offset_bytes=offset,
                                        data=f.data[offset:offset + CHUNK_BYTES])


class ModelFilesCorrupt(ValueError):
    """What arrived is not what the trainer holds (a size, a checksum or a name is wrong)."""


async def fetch_model_files(channel: grpc.aio.Channel, dest: Path) -> list[str]:
    """Every file FetchModel sends, checked and written into `dest` (made if needed); returns
    their names. Raises grpc.aio.AioRpcError (the trainer unreachable, or UNIMPLEMENTED: it
    serves no model) or ModelFilesCorrupt."""
    call = channel.unary_stream(FETCH_MODEL, request_serializer=pb.FetchModelRequest.SerializeToString,
                                response_deserializer=pb.FetchModelResponse.FromString)
    dest.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    current: tuple[str, int, str, bytearray] | None = None

    def finish(name: str, size: int, sha: str, data: bytearray) -> None:
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            raise ModelFilesCorrupt(f"model file {name}: {len(data)} of {size} bytes arrived, or its SHA-256 differs")
        partial = dest / f".{name}.partial"
        partial.write_bytes(data)
        partial.replace(dest / name)
        names.append(name)

    async for chunk in call(pb.FetchModelRequest()):
        if not chunk.name or "/" in chunk.name or chunk.name.startswith(".") or is_weight_file(chunk.name):
            raise ModelFilesCorrupt(f"the trainer sent a model file named {chunk.name!r}")
        if current is None or current[0] != chunk.name:
            if current is not None:
                finish(*current)
            current = (chunk.name, chunk.size_bytes, chunk.sha256, bytearray())
        if chunk.offset_bytes != len(current[3]):
            raise ModelFilesCorrupt(f"model file {chunk.name}: chunk at byte {chunk.offset_bytes}, expected "
                                    f"{len(current[3])}")
        current[3].extend(chunk.data)
    if current is not None:
        finish(*current)
    if "config.json" not in names:
        raise ModelFilesCorrupt("the trainer's model files hold no config.json")
    return names


async def wait_for_model_files(open_channel, dest: Path, address: str, give_up_after_s: float | None,
                               retry_s: float = 1.0, log_every_s: float = WAIT_LOG_S) -> list[str]:
    """fetch_model_files from the trainer at `address`, dialled again every `retry_s` while it
    is unreachable (it may start after this replica: queued, loading), saying so every
    `log_every_s`; RuntimeError naming the trainer once `give_up_after_s` passed (None: never),
    or at once when it refuses."""
    started = time.monotonic()
    said = None
    bound = "no bound: generators.reconnect.giveUpAfterSeconds is unset" if give_up_after_s is None \
        else f"giving up after {give_up_after_s:.0f}s"
    while True:
        channel = open_channel(address)
        try:
            return await fetch_model_files(channel, dest)
        except grpc.aio.AioRpcError as err:
            if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise RuntimeError(f"the trainer at {address} refused the model's files: {err.code().name}: "
                                   f"{err.details()}") from err
            now = time.monotonic()
            waited = now - started
            if give_up_after_s is not None and waited >= give_up_after_s:
                raise RuntimeError(f"the trainer at {address} stayed unreachable for {waited:.0f}s while this replica "
                                   f"waited for the model's files (generators.reconnect.giveUpAfterSeconds "
                                   f"{give_up_after_s:.0f}): {err.details()}") from err
            if said is None or now - said >= log_every_s:
                log.info("waiting for the trainer at %s to serve the model's files: unreachable for %.0fs (%s)",
                         address, waited, bound)
                said = now
        finally:
            await channel.close()
        await asyncio.sleep(retry_s)
