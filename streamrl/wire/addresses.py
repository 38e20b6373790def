"""Host and port as one address, and the listening socket of a host: IPv6 literals go in
brackets (`[::]:50051`, `[fd00::5]:8080`), `::` listens on every IPv6 and IPv4 address of
the machine (a dual-stack socket). Knows no protocol."""

from __future__ import annotations

import logging
import socket

log = logging.getLogger(__name__)

ANY = "::"
"""Every address of the machine, IPv6 and IPv4 (what pods listen on: IPv4, IPv6 and
dual-stack clusters alike)."""
ANY_IPV4 = "0.0.0.0"


def join_host_port(host: str, port: int) -> str:
    """`host:port`, an IPv6 literal in brackets, as gRPC targets and URLs want it."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port (port 0: any free one). `::` is dual-stack, so
    127.0.0.1 reaches it as ::1 does; on a machine without IPv6 it is 0.0.0.0."""
    if ":" not in host:
        return socket.create_server((host, port), family=socket.AF_INET)
    try:
        return socket.create_server((host, port), family=socket.AF_INET6,
                                    dualstack_ipv6=host == ANY and socket.has_dualstack_ipv6())
    except OSError as err:
        if host != ANY:
            raise
        log.warning("cannot listen on [::]:%d (%s): this machine has no IPv6; listening on %s:%d", port, err,
                    ANY_IPV4, port)
        return socket.create_server((ANY_IPV4, port), family=socket.AF_INET)
