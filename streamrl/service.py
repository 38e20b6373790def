"""The process shell the trainer, the generator and the ranker run in: the admin HTTP
surface, an asyncio gRPC server with health, the endpoint file, signals (the first asks
the service to leave — drain or stop — the second stops it at once), NOT_SERVING from the
moment it begins to leave, and the exit code. A service brings its main coroutine and what
its signals mean; the shell owns everything around them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from enum import IntEnum
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from streamrl.admin import AdminServer
from streamrl.spec import SecuritySpec
from streamrl.wire.addresses import join_host_port
from streamrl.wire.channels import add_port, new_server

log = logging.getLogger(__name__)

GRPC_STOP_GRACE_S = 2.0
"""Seconds in-flight calls get to finish when the gRPC server stops."""


def process_started_unix(pid: int | str = "self") -> float:
    """When a process started (Unix seconds), as the kernel recorded it: interpreter start
    and imports included. Linux only; elsewhere, now."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        since_boot = ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, IndexError):
        return time.time()


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    JOB_ERROR = 78
    """EX_CONFIG: the job's own code or files failed in a way every start repeats (its reward
    function raised with reward.onError fail, its checkpoints belong to another job): the local
    runner and the operator do not restart it."""
    INTERRUPTED = 130
    """Stopped by a signal before its work was done (128 + SIGINT, as a shell reports it)."""


class Service:
    def __init__(self, role: str, registry: CollectorRegistry, status: Callable[[], BaseModel | dict[str, Any]],
                 host: str = "127.0.0.1", admin_port: int = 0, endpoint_file: Path | None = None,
                 security: SecuritySpec | None = None):
        self.role = role
        self.host = host
        self.security = security or SecuritySpec()
        self.endpoint_file = endpoint_file
        self.ready_when: Callable[[], bool] = lambda: True
        """What else readiness needs besides serving (e.g. the trainer running, a replica connected)."""
        self.waiting_for: Callable[[], str] = lambda: ""
        """What it waits for while not ready (e.g. an absent trainer), for /readyz's body."""
        self.admin = AdminServer(registry, status, self.ready, host, admin_port, lambda: self.waiting_for())
        self.server: grpc.aio.Server | None = None
        self.grpc_port = 0
        # health.aio: the module imports it; typeshed's grpc_health stubs lack it (the ignores)
        self._health: health.aio.HealthServicer | None = None  # pyright: ignore[reportAttributeAccessIssue]
        self._services: tuple[str, ...] = ()
        self._serving = False
        self._signals = 0
        self.last_signal: int | None = None
        """The latest signal that reached run() (SIGTERM or SIGINT), for services that treat them apart."""
        self._leaving: asyncio.Task | None = None

    # ---- start ------------------------------------------------------------------------
    def start_admin(self) -> None:
        """The admin surface first, so probes and scrapes see the process while it loads."""
        self.admin.start()

    async def start_grpc(self, register: Callable[[grpc.aio.Server], None], services: tuple[str, ...],
                         port: int) -> int:
        """An asyncio gRPC server with what `register` adds to it and gRPC health for
        `services` (NOT_SERVING until `serving()`); returns its port."""
        self.server = new_server(self.security)
        register(self.server)
        self._health = health.aio.HealthServicer()  # pyright: ignore[reportAttributeAccessIssue]
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self.server)
        self._services = ("", *services)
        self.grpc_port = add_port(self.server, join_host_port(self.host, port), self.security)
        await self.server.start()
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        return self.grpc_port

    async def serving(self) -> None:
        """Ready to work: health SERVING, and the endpoint file tells whoever started this
        process where it listens (written atomically: the file appears whole)."""
        self._serving = True
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        if self.endpoint_file is not None:
            tmp = self.endpoint_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"admin_port": self.admin.port, "grpc_port": self.grpc_port,
                                       "pid": os.getpid()}))
            tmp.rename(self.endpoint_file)

    def ready(self) -> bool:
        return self._serving and self.ready_when()

    # ---- run and leave ----------------------------------------------------------------
    async def run(self, main: Awaitable[int], on_signal: Callable[[int], None]) -> int:
        """Run `main` to its exit code. SIGTERM/SIGINT turn health NOT_SERVING at once and
        call on_signal(n) with how many signals came so far; the service decides what the
        first and the second mean. The shell stops everything on the way out."""
        loop = asyncio.get_running_loop()

        def signalled(signum: int) -> None:
            self._signals += 1
            self.last_signal = signum
            log.info("%s: %s (%d)", self.role, signal.Signals(signum).name, self._signals)
            self._leaving = loop.create_task(self.leave())  # held: the loop keeps only a weak reference
            on_signal(self._signals)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, signalled, sig)
        try:
            return await main
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self.stop()

    async def leave(self) -> None:
        """Beginning to drain or stop: not ready, health NOT_SERVING."""
        if self._serving:
            log.info("%s: leaving; health NOT_SERVING", self.role)
        self._serving = False
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self) -> None:
        await self.leave()
        if self.server is not None:
            await self.server.stop(GRPC_STOP_GRACE_S)
        self.admin.stop()

    async def _set_health(self, status) -> None:
        if self._health is not None:
            for name in self._services:
                await self._health.set(name, status)
