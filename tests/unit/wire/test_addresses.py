"""Addresses: IPv6 literals in brackets, `::` listening on IPv4 and IPv6 (N19)."""

import socket

import pytest

from streamrl.wire.addresses import join_host_port, listening_socket


@pytest.mark.parametrize("host, address", [
    ("10.0.0.5", "10.0.0.5:50052"), ("gen-0.rl.svc", "gen-0.rl.svc:50052"), ("fd00::5", "[fd00::5]:50052"),
    ("::", "[::]:50052"), ("[fd00::5]", "[fd00::5]:50052"),
])
def test_an_ipv6_literal_is_bracketed_and_any_other_host_is_not(host, address):
    assert join_host_port(host, 50052) == address


def test_any_address_listens_on_ipv4_and_ipv6_where_the_machine_has_both():
    with listening_socket("::", 0) as sock:
        if not socket.has_dualstack_ipv6():
            pytest.skip("no dual-stack sockets here")
        assert sock.family == socket.AF_INET6
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
        with socket.create_connection(("127.0.0.1", sock.getsockname()[1]), timeout=2):
            pass


def test_an_ipv4_host_listens_on_ipv4():
    with listening_socket("127.0.0.1", 0) as sock:
        assert sock.family == socket.AF_INET
