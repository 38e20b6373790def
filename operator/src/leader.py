"""Leader election on a coordination.k8s.io Lease, the way client-go's leaderelection does it:
one operator replica reconciles, the others wait and take over once the leader has not renewed
for a lease's duration (as they observed it on their own clock, so clocks need not agree). A
leader that cannot renew within its deadline stops: two replicas never both reconcile.
Knows no handler."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from streamrl.operator.kube import KubeClient, KubeError, path_of

LEASE_NAME = "streamrl-operator"
LEASE_API = "coordination.k8s.io/v1"
log = logging.getLogger("streamrl.operator")


@dataclass(frozen=True)
class LeaseTimes:
    """client-go's defaults (LeaseDuration 15 s, RenewDeadline 10 s, RetryPeriod 2 s)."""

    duration_s: float = 15.0
    """How long a lease not renewed keeps the others waiting."""
    renew_deadline_s: float = 10.0
    """How long the leader goes on without a successful renewal before it stops."""
    retry_s: float = 2.0
    """Between two tries (to acquire, or to renew)."""


class LostLeadership(RuntimeError):
    """The leader could not renew its lease in time: another replica may lead now."""


def _micro_time(t: float) -> str:
    """A MicroTime as the API server writes it."""
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    """One replica's side of the election for the Lease `name` in `namespace`."""

    def __init__(self, kube: KubeClient, namespace: str, identity: str, times: LeaseTimes = LeaseTimes(),
                 name: str = LEASE_NAME, clock: Callable[[], float] = time.monotonic):
        self.kube, self.identity, self.times, self.clock = kube, identity, times, clock
        self.namespace, self.name = namespace, name
        self.path = path_of(LEASE_API, "Lease", namespace, name)
        self._observed: tuple[str, str] | None = None
        """(holder, renewTime) of the record last seen, and when (self.clock) it was first seen so."""
        self._observed_at = 0.0
        self.holder: str | None = None
        """Who held the lease at the last try."""

    async def try_acquire_or_renew(self) -> bool:
        """One try: True when this replica holds the lease now (taken, or renewed)."""
        now, wall = self.clock(), time.time()
        current = await self.kube.get(self.path)
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.times.duration_s),
                "renewTime": _micro_time(wall)}
        if current is None:
            lease = {"apiVersion": LEASE_API, "kind": "Lease",
                     "metadata": {"name": self.name, "namespace": self.namespace},
                     "spec": {**spec, "acquireTime": _micro_time(wall), "leaseTransitions": 0}}
            try:
                await self.kube.create(lease)
            except KubeError as err:
                if err.status == 409:  # another replica created it first
                    return False
                raise
            self.holder = self.identity
            return True
        held = current.get("spec") or {}
        holder = held.get("holderIdentity") or ""
        record = (holder, held.get("renewTime") or "")
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(held.get("leaseDurationSeconds") or self.times.duration_s)
        self.holder = holder or None
        if holder and holder != self.identity and now < self._observed_at + duration:
            return False  # held by another, renewed within its duration as seen from here
        if holder != self.identity:
            spec.update(acquireTime=_micro_time(wall), leaseTransitions=int(held.get("leaseTransitions") or 0) + 1)
        try:  # the resourceVersion makes it a compare-and-swap: of two replicas, one wins
            await self.kube.patch(self.path, {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                                              "spec": spec})
        except KubeError as err:
            if err.status == 409:
                return False
            raise
        self.holder = self.identity
        return True

    async def acquire(self, say: Callable[[str], None] = log.info, say_every_s: float = 30.0) -> None:
        """Wait until this replica leads, saying whom it waits for."""
        said = -float("inf")
        while not await self._try():
            if self.clock() - said >= say_every_s:
                said = self.clock()
                say(f"waiting to lead: Lease {self.namespace}/{self.name} is held by {self.holder}; another "
                    f"operator replica reconciles (this one takes over {self.times.duration_s:g} s after it stops "
                    "renewing)")
            await asyncio.sleep(self.times.retry_s)
        say(f"leading: holds Lease {self.namespace}/{self.name} as {self.identity}")

    async def keep(self) -> None:
        """Renew every retry period; LostLeadership once no renewal succeeded for the deadline."""
        renewed = self.clock()
        while True:
            await asyncio.sleep(self.times.retry_s)
            if await self._try():
                renewed = self.clock()
            elif self.clock() - renewed > self.times.renew_deadline_s:
                raise LostLeadership(f"Lease {self.namespace}/{self.name} not renewed for "
                                     f"{self.clock() - renewed:.0f} s (now held by {self.holder or 'nobody'}): "
                                     "stopping, so that two replicas never both reconcile")

    async def release(self) -> None:
        """Give the lease up (on a clean exit), so a waiting replica takes over at once."""
        current = await self.kube.get(self.path)
        if current is None or (current.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        try:
            await self.kube.patch(self.path, {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                                              "spec": {"holderIdentity": "", "leaseDurationSeconds": 1}})
        except KubeError as err:
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, err)

    async def _try(self) -> bool:
        """A try whose API errors (a restart of the API server, throttling) count as a failed try."""
        try:
            return await self.try_acquire_or_renew()
        except (KubeError, httpx.HTTPError) as err:
            log.warning("Lease %s/%s: %s", self.namespace, self.name, err)
            return False
