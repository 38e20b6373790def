"""The replicas as the rollout holds them, and what is decided over all of them at once: who
joins, drains and leaves (the weight relay told, the long tail replanned), work handed out
(the groups opened, the work queue's dispatcher), which replicas serve the long tail (the
long-tail planner, for the demand it is given, each replica told its batch cap), and whether
the rollout stands at its barrier (no work pending or out anywhere). The trainer's Coordinator
adds intake, metrics and its event loop; the simulator adds engines and links; both are this."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic

from streamrl.messages import BatchCap, WeightsLoaded, WeightsNotice
from streamrl.rollout import longtail, workqueue
from streamrl.rollout.longtail import LatencyProfile, LongTailDemand, LongTailPlan, ReplicaProfile
from streamrl.rollout.relay import WeightRelay
from streamrl.rollout.replica import Replica
from streamrl.rollout.work import GroupBook, InFlight, P, PromptWork
from streamrl.rollout.workqueue import WorkQueue
from streamrl.spec import DispatchSpec


def _no_demand() -> LongTailDemand | None:
    return None


class Fleet(Generic[P]):
    def __init__(self, queue: WorkQueue, relay: WeightRelay, book: GroupBook[P],
                 dispatch: DispatchSpec | None = None, demand: Callable[[], LongTailDemand | None] = _no_demand):
        self.queue = queue
        self.relay = relay
        self.book = book
        """Every group from dispatch to consumption."""
        self.dispatch_spec = dispatch or DispatchSpec()
        self.demand = demand
        """The long-tail demand to plan for now (the IterationPlanner's latest; None: no predictions)."""
        self.replicas: dict[str, Replica] = {}
        """Connected replicas by generator id (draining ones included, until they leave)."""
        self._routed = False

    # ---- membership -------------------------------------------------------------------
    def join(self, replica: Replica) -> None:
        """A replica joins: the relay tells it what to fetch, the long tail is replanned, work goes out."""
        self.replicas[replica.generator_id] = replica
        self.relay.joined(replica, self.replicas.values())
        self._membership_changed()

    def drain(self, generator_id: str) -> Replica | None:
        """A replica is leaving gracefully: nothing more for it (the long tail is replanned
        without it), released once what it holds has arrived. Returns it when this call set it
        draining (None: unknown, or draining already)."""
        replica = self.replicas.get(generator_id)
        if replica is None or replica.draining:
            return None
        replica.draining = True
        self.replan()
        self.release_if_drained(replica)
        self.dispatch()
        return replica

    def release_if_drained(self, replica: Replica) -> None:
        """A draining replica whose every assigned sample arrived is released (at once, and
        after each sample that arrives from it until it leaves)."""
        if replica.draining and not replica.outstanding and replica.generator_id in self.replicas:
            self.released(replica)

    def released(self, replica: Replica) -> None:
        """A draining replica holds nothing more: let it go (the Coordinator ends its stream,
        whose end then calls leave; the simulator makes it leave at once)."""

    def leave(self, generator_id: str) -> Replica | None:
        """Forget a replica (what it still held is the caller's to re-issue, first): the relay
        and the long-tail plan go on without it."""
        replica = self.replicas.pop(generator_id, None)
        if replica is not None:
            self.relay.left(replica, list(self.replicas.values()))
            self._membership_changed()
        return replica

    def _membership_changed(self) -> None:
        self._routed = WorkQueue.routed(self.replicas.values())
        self.replan()
        self.dispatch()

    def live(self, pool: str | None = None) -> list[Replica]:
        """Replicas taking work (not draining), of one pool or all."""
        return [r for r in self.replicas.values() if not r.draining and (pool is None or r.pool == pool)]

    # ---- work -------------------------------------------------------------------------
    def add_prompts(self, iteration: int, prompts: list[PromptWork], group_size: int,
                    min_policy_version: int) -> None:
        """Queue the prompts of one iteration (with predictions, longest first) and hand out
        what fits, the long-tail replicas chosen first for the demand its predictions made."""
        self.replan()
        self.queue_work(self.book.open(iteration, workqueue.dispatch_order(prompts), group_size, min_policy_version))

    def queue_work(self, tasks: list[InFlight]) -> None:
        """Queue these prompts' samples (in this order) and hand out what fits."""
        self.queue.add(tasks)
        self.dispatch()

    def requeue(self, task: InFlight, indices: list[int]) -> None:
        self.queue.requeue(task, indices)
        self.dispatch()

    def dispatch(self) -> None:
        self.queue.dispatch(self.replicas.values())
        self.at_barrier(self.barrier)

    @property
    def barrier(self) -> bool:
        """No work pending or out on any replica: every generator waits for the trainer (its
        step, its next iteration's work), so their idle time is the pipeline's shape."""
        return not self.queue.has_pending and not any(r.outstanding for r in self.replicas.values())

    def at_barrier(self, barrier: bool) -> None:
        """After every dispatch: whether the rollout now stands at its barrier (accounted by the caller)."""

    @property
    def routed(self) -> bool:
        """Long-tail work goes only to long-tail replicas: both kinds exist (WorkQueue.dispatch's
        rule), as of the last change of membership or routing (the only writers of either)."""
        return self._routed

    # ---- the long tail ----------------------------------------------------------------
    def replan(self) -> LongTailPlan | None:
        """Choose the long-tail replicas for the current demand (when an iteration's prompts go
        out, and when replicas join, drain or leave)."""
        return self.plan_long_tail(self.demand(), self.dispatch_spec)

    def plan_long_tail(self, demand: LongTailDemand | None, dispatch: DispatchSpec) -> LongTailPlan | None:
        """Choose the long-tail replicas for `demand` among those taking work and route to them
        (when there is a demand and a replica: else nothing changes and None)."""
        if demand is None:
            return None
        profiles = [ReplicaProfile(r.generator_id, LatencyProfile(r.latency_profile or ((1, 1.0),)), r.capacity)
                    for r in self.live()]
        if not profiles:
            return None
        plan = longtail.plan_long_tail(demand, profiles, dispatch.long_tail_batch_cap, dispatch.objective)
        self.route_long_tail(set(plan.long_replicas), dispatch.long_tail_batch_cap)
        return plan

    def route_long_tail(self, replica_ids: set[str], batch_cap: int) -> None:
        """Route long-tail prompts to these replicas, which decode at most batch_cap at once;
        the others run at full capacity and take the rest."""
        for r in self.replicas.values():
            long_tail = r.generator_id in replica_ids
            if long_tail != r.long_tail or long_tail:
                r.outbox.put_nowait(BatchCap(batch_cap if long_tail else 0))
            r.long_tail = long_tail
        self._routed = WorkQueue.routed(self.replicas.values())
        self.dispatch()

    # ---- weights ----------------------------------------------------------------------
    def announce(self, notice: WeightsNotice) -> None:
        """A version was published: the relay says who fetches it from where."""
        self.relay.announce(notice, self.replicas.values())

    def loaded(self, generator_id: str, msg: WeightsLoaded) -> None:
        """A replica holds a version (peers waiting for it in its pool may fetch it from it now)."""
        loader = self.replicas.get(generator_id)
        if loader is not None:
            self.relay.loaded(loader, msg, self.replicas.values())
