"""Loopback TCP ports for the processes of a local run, chosen before they start. Knows
nothing of what listens on them."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_handed_out: set[int] = set()


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The bottom of the kernel's ephemeral port range (Linux's default when unreadable)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port free on loopback now, for a process started next; never the same one
    twice in this process. It comes from below the kernel's ephemeral range: a port from
    that range could be handed to another socket binding port 0 (the trainer's gRPC
    server, an outgoing connection) before the process that was promised it binds it."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(64 if low > 11000 else 0):
        port = rng.randrange(10000, low)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
