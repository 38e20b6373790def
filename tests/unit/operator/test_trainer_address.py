"""The address a remote pool dials the trainer at: host and port, an IPv6 load balancer or
node address in brackets (N19)."""

import pytest

from streamrl.operator.remote import trainer_address
from streamrl.operator.runtime import Runtime
from streamrl.spec import RLJob, parse_job

TLS = {"tls": {"secretName": "x-tls"}}  # a trainer reached from outside the cluster needs it


def _job(**trainer) -> RLJob:
    return parse_job({"metadata": {"name": "x"}, "spec": {"model": {"source": "builtin-tiny"}, "trainer": trainer,
                                                          "security": TLS}})


class _FakeKube:
    """An API server holding the trainer's Service alone."""

    def __init__(self, service: dict):
        self.service = service

    async def get(self, path: str) -> dict:
        assert path.endswith("/services/x-trainer"), path
        return self.service


@pytest.mark.parametrize("ip, address", [("203.0.113.7", "203.0.113.7:50051"),
                                         ("2001:db8::7", "[2001:db8::7]:50051")])
async def test_a_load_balancers_address_is_host_and_port(ip, address):
    job = _job(serviceType="LoadBalancer")
    service = {"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}
    assert await trainer_address(Runtime(_FakeKube(service)), job, "rl") == (address, None)


async def test_a_node_ports_ipv6_external_host_is_bracketed():
    job = _job(serviceType="NodePort", externalHost="2001:db8::1")
    service = {"spec": {"ports": [{"name": "grpc", "nodePort": 31051}]}}
    assert await trainer_address(Runtime(_FakeKube(service)), job, "rl") == ("[2001:db8::1]:31051", None)
