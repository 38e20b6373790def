"""Leader election over a Lease on the emulated API server: one replica leads, another waits
and takes over once the leader stops renewing (as it observed, on its own clock) or releases;
a leader that cannot renew stops. The cluster id: the chart's, else kube-system's uid."""

from __future__ import annotations

import asyncio

import pytest

from streamrl.operator.kube import KubeClient
from streamrl.operator.leader import Elector, LeaseTimes, LostLeadership
from streamrl.operator.main import cluster_id
from streamrl.operator.settings import Settings

FAST = LeaseTimes(duration_s=1.0, renew_deadline_s=0.6, retry_s=0.1)
LEASE = ("coordination.k8s.io/v1/leases", "streamrl-system", "streamrl-operator")


@pytest.fixture
async def clients(k8s):
    a, b = KubeClient(str(k8s.url), name="a"), KubeClient(str(k8s.url), name="b")
    yield a, b
    await a.close()
    await b.close()


async def test_one_replica_leads_and_the_other_takes_over_when_it_stops_renewing(k8s, clients):
    a = Elector(clients[0], "streamrl-system", "operator-a", FAST)
    b = Elector(clients[1], "streamrl-system", "operator-b", FAST)
    await asyncio.wait_for(a.acquire(), timeout=5)
    assert k8s.objects[LEASE]["spec"]["holderIdentity"] == "operator-a"
    assert not await b.try_acquire_or_renew() and b.holder == "operator-a"
    said: list[str] = []
    waiting = asyncio.create_task(b.acquire(say=said.append))
    await asyncio.sleep(0.5)
    assert await a.try_acquire_or_renew()  # a renews: b still waits
    await asyncio.sleep(0.5)
    assert not waiting.done()
    assert said[0].startswith("waiting to lead: Lease streamrl-system/streamrl-operator is held by operator-a")
    # a stops renewing (it froze, or its node went): b takes over a lease duration later.
    await asyncio.wait_for(waiting, timeout=3)
    lease = k8s.objects[LEASE]["spec"]
    assert lease["holderIdentity"] == "operator-b" and lease["leaseTransitions"] == 1
    assert said[-1] == "leading: holds Lease streamrl-system/streamrl-operator as operator-b"
    # a, waking up, must not reconcile beside b: it cannot renew, and stops after its deadline.
    with pytest.raises(LostLeadership, match="now held by operator-b"):
        await asyncio.wait_for(a.keep(), timeout=3)


async def test_a_leader_that_releases_hands_over_at_once(k8s, clients):
    a = Elector(clients[0], "streamrl-system", "operator-a", LeaseTimes(duration_s=60, retry_s=0.05))
    b = Elector(clients[1], "streamrl-system", "operator-b", LeaseTimes(duration_s=60, retry_s=0.05))
    await a.acquire()
    assert not await b.try_acquire_or_renew()
    await a.release()
    await asyncio.wait_for(b.acquire(), timeout=2)  # well before the 60 s lease would expire
    assert k8s.objects[LEASE]["spec"]["holderIdentity"] == "operator-b"


async def test_two_replicas_racing_for_a_free_lease_never_both_win(k8s, clients):
    a = Elector(clients[0], "streamrl-system", "operator-a", FAST)
    b = Elector(clients[1], "streamrl-system", "operator-b", FAST)
    for _ in range(5):
        won = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
        holder = k8s.objects[LEASE]["spec"]["holderIdentity"]
        assert won.count(True) <= 1 and (won == [holder == "operator-a", holder == "operator-b"] or not any(won))


async def test_the_cluster_id_is_the_charts_else_the_uid_of_kube_system(k8s, clients):
    assert await cluster_id(clients[0], Settings(cluster_id="prod-eu")) == "prod-eu"
    with pytest.raises(ValueError, match="there is no namespace kube-system: set one with the chart's clusterId"):
        await cluster_id(clients[0], Settings())
    k8s.namespaces["kube-system"] = {"apiVersion": "v1", "kind": "Namespace",
                                     "metadata": {"name": "kube-system", "uid": "5d1c0e6a-0b7e-4bd4-9d61-0c0d1d1f2e3a"}}
    assert await cluster_id(clients[0], Settings()) == "5d1c0e6a-0b7e-4bd4-9d61-0c0d1d1f2e3a"
