"""A channel opened after a peer comes back reaches it at once, whatever an earlier channel to
the same address went through: gRPC shares connections (subchannels) process-wide by default,
so a new channel would inherit one still backing off from failed attempts (up to 120 s) and
fail fast with "Connection refused" while the peer is up. A generator redialling a restarted
trainer on its own backoff (spec.generators.reconnect) once waited out the whole run that way."""

from __future__ import annotations

import asyncio
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from streamrl.local.ports import free_port
from streamrl.spec import SecuritySpec
from streamrl.wire.channels import open_channel


async def _check(channel: grpc.aio.Channel) -> bool:
    try:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        return True
    except grpc.aio.AioRpcError as err:
        assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), err
        return False


async def _redial_after_failures() -> float:
    address = f"127.0.0.1:{free_port()}"
    lingering = open_channel(address, SecuritySpec())  # kept open, as a long-lived channel would be
    try:
        # Attempts while nothing listens: the connection backs off a little longer after each.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4.0:
            assert not await _check(lingering)
            await asyncio.sleep(0.2)
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        server.add_insecure_port(address)
        await server.start()
        up = time.monotonic()
        try:
            while True:  # a new channel per attempt, as the generator's redial loop opens
                async with open_channel(address, SecuritySpec()) as channel:
                    if await _check(channel):
                        return time.monotonic() - up
                assert time.monotonic() - up < 10.0, "a fresh channel never reached the server that came back"
                await asyncio.sleep(0.2)
        finally:
            await server.stop(None)
    finally:
        await lingering.close()


def test_a_fresh_channel_reaches_a_peer_that_came_back_at_once():
    assert asyncio.run(_redial_after_failures()) < 0.5
