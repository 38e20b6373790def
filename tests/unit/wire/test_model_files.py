"""FetchModel over a real loopback gRPC server: the model's files other than weights arrive
whole and checked, weight files are never served, a corrupt file is refused, and a replica
waiting for an unreachable trainer gives up saying so."""

import grpc
import pytest

from streamrl.models import build_tiny_model
from streamrl.spec import SecuritySpec
from streamrl.v1 import rollout_pb2 as pb
from streamrl.wire.channels import open_channel
from streamrl.wire.model_files import (
    CHUNK_BYTES,
    ModelFilesCorrupt,
    fetch_model_files,
    model_responses,
    read_model_files,
    wait_for_model_files,
)
from streamrl.wire.transfer import rollout_handler


async def _serve(fetch_model) -> tuple[grpc.aio.Server, str]:
    async def refuse(*_):
        raise NotImplementedError

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((rollout_handler(refuse, refuse, fetch_model),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_the_files_served_are_every_top_level_file_but_the_weights(tmp_path):
    model = build_tiny_model(tmp_path / "m")
    (model / "model.safetensors.index.json").write_text("{}")
    (model / "notes").mkdir()
    names = [f.name for f in read_model_files(model)]
    assert names == ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    with pytest.raises(ValueError, match="no config.json"):
        read_model_files(tmp_path / "m" / "notes")


async def test_fetched_files_are_the_trainers_byte_for_byte_across_chunks(tmp_path):
    model = build_tiny_model(tmp_path / "m")
    big = b"x" * (2 * CHUNK_BYTES + 17)  # a file of three chunks
    (model / "vocab.txt").write_bytes(big)
    files = read_model_files(model)

    async def fetch_model(request, context):
        for response in model_responses(files):
            yield response

    server, address = await _serve(fetch_model)
    channel = open_channel(address, SecuritySpec())
    try:
        names = await fetch_model_files(channel, tmp_path / "booted")
    finally:
        await channel.close()
        await server.stop(None)
    assert names == [f.name for f in files]
    for f in files:
        assert (tmp_path / "booted" / f.name).read_bytes() == (model / f.name).read_bytes()
    assert not (tmp_path / "booted" / "model.safetensors").exists()


async def test_a_file_that_arrives_changed_is_refused_and_not_written(tmp_path):
    async def fetch_model(request, context):
        yield pb.FetchModelResponse(name="config.json", size_bytes=2, sha256="0" * 64, offset_bytes=0, data=b"{}")

    server, address = await _serve(fetch_model)
    channel = open_channel(address, SecuritySpec())
    try:
        with pytest.raises(ModelFilesCorrupt, match="config.json"):
            await fetch_model_files(channel, tmp_path / "booted")
    finally:
        await channel.close()
        await server.stop(None)
    assert not (tmp_path / "booted" / "config.json").exists()


async def test_a_weight_file_or_a_path_from_the_trainer_is_refused(tmp_path):
    async def fetch_model(request, context):
        yield pb.FetchModelResponse(name="../config.json", size_bytes=0, sha256="", offset_bytes=0, data=b"")

    server, address = await _serve(fetch_model)
    channel = open_channel(address, SecuritySpec())
    try:
        with pytest.raises(ModelFilesCorrupt, match=r"\.\./config\.json"):
            await fetch_model_files(channel, tmp_path / "booted")
    finally:
        await channel.close()
        await server.stop(None)


async def test_waiting_for_an_unreachable_trainer_gives_up_naming_it_and_the_setting(tmp_path):
    with pytest.raises(RuntimeError, match=r"127\.0\.0\.1:9 stayed unreachable .*giveUpAfterSeconds"):
        await wait_for_model_files(lambda address: open_channel(address, SecuritySpec()), tmp_path / "booted",
                                   "127.0.0.1:9", give_up_after_s=0.5, retry_s=0.1)
