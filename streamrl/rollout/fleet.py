"""The replicas as the rollout holds them, and what is decided over all of them at once: who
joins and leaves (the weight relay told), work handed out (the groups opened, the work queue's
dispatcher), which replicas serve the long tail (the long-tail planner, each told its batch
cap), and whether the rollout stands at its barrier (no work pending or out anywhere). The
trainer's Coordinator adds intake, metrics and its event loop; the simulator adds engines and
links; both are this."""

from __future__ import annotations

from typing import Generic

from streamrl.messages import BatchCap, WeightsLoaded, WeightsNotice
from streamrl.rollout import longtail, workqueue
from streamrl.rollout.longtail import LatencyProfile, LongTailDemand, LongTailPlan, ReplicaProfile
from streamrl.rollout.relay import WeightRelay
from streamrl.rollout.replica import Replica
from streamrl.rollout.work import GroupBook, InFlight, P, PromptWork
from streamrl.rollout.workqueue import WorkQueue
from streamrl.spec import DispatchSpec


class Fleet(Generic[P]):
    def __init__(self, queue: WorkQueue, relay: WeightRelay, book: GroupBook[P]):
        self.queue = queue
        self.relay = relay
        self.book = book
        """Every group from dispatch to consumption."""
        self.replicas: dict[str, Replica] = {}
        """Connected replicas by generator id (draining ones included, until they leave)."""

    # ---- membership -------------------------------------------------------------------
    def join(self, replica: Replica) -> None:
        self.replicas[replica.generator_id] = replica
        self.relay.joined(replica, self.replicas.values())

    def leave(self, generator_id: str) -> Replica | None:
        """Forget a replica (what it still held is the caller's to re-issue)."""
        replica = self.replicas.pop(generator_id, None)
        if replica is not None:
            self.relay.left(replica, list(self.replicas.values()))
        return replica

    def live(self, pool: str | None = None) -> list[Replica]:
        """Replicas taking work (not draining), of one pool or all."""
        return [r for r in self.replicas.values() if not r.draining and (pool is None or r.pool == pool)]

    # ---- work -------------------------------------------------------------------------
    def add_prompts(self, iteration: int, prompts: list[PromptWork], group_size: int,
                    min_policy_version: int) -> None:
        """Queue the prompts of one iteration (with predictions, longest first) and hand out what fits."""
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
        """Long-tail work goes only to long-tail replicas: both kinds exist (WorkQueue.dispatch's rule)."""
        return WorkQueue.routed(self.replicas.values())

    # ---- the long tail ----------------------------------------------------------------
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
