"""The rollout core's Fleet, as the trainer and the simulator both run it: dispatch agrees with
could_take, the long-tail plan routes and caps, the barrier is seen after every dispatch."""

from queue import SimpleQueue

from streamrl.messages import BatchCap, Work
from streamrl.rollout.counters import RolloutCounters
from streamrl.rollout.fleet import Fleet
from streamrl.rollout.longtail import LongTailDemand
from streamrl.rollout.relay import WeightRelay
from streamrl.rollout.replica import Replica
from streamrl.rollout.work import GroupBook, InFlight, PromptWork, SamplingConfig
from streamrl.rollout.workqueue import WorkQueue
from streamrl.spec import DispatchSpec
from tests.outbox import sent


class _RecordingFleet(Fleet):
    def __init__(self):
        super().__init__(WorkQueue(SamplingConfig(1.0, 1.0, 16, 0), RolloutCounters(), 1.0), WeightRelay(),
                         GroupBook())
        self.barriers: list[bool] = []

    def at_barrier(self, barrier: bool) -> None:
        self.barriers.append(barrier)


def _replica(gid, capacity=4, profile=((1, 0.011), (64, 0.074))):
    return Replica(gid, "default", capacity, "torch", 0, latency_profile=profile, outbox=SimpleQueue())


def _task(prompt_id, group_size=4, long_tail=False):
    return InFlight(PromptWork(prompt_id, 0, "", (1,), long_tail=long_tail), 0, group_size, 0, 0)


def test_could_take_says_what_dispatch_then_does():
    fleet = _RecordingFleet()
    a = _replica("a", capacity=4)
    fleet.join(a)
    fleet.queue.add([_task("p0", 4), _task("p1", 4)])
    assert fleet.queue.could_take(a, routed=False)
    fleet.dispatch()
    assert {k for k in a.outstanding} == {("p0", i) for i in range(4)}  # one whole group fills it
    assert not fleet.queue.could_take(a, routed=False)  # no room left
    a.outstanding.clear()
    assert fleet.queue.could_take(a, routed=False)


def test_a_group_waits_to_fit_whole_and_could_take_agrees():
    fleet = _RecordingFleet()
    a = _replica("a", capacity=4)
    fleet.join(a)
    a.outstanding.add(("held", 0))  # room 3 of 4: a group of 4 waits
    fleet.queue.add([_task("p0", 4)])
    assert not fleet.queue.could_take(a, routed=False)
    fleet.dispatch()
    assert a.outstanding == {("held", 0)}


def test_the_long_tail_plan_routes_and_caps_and_the_barrier_is_seen():
    fleet = _RecordingFleet()
    # the planner's own case: the long tail goes to the replica fastest at small batches
    slow, fast = _replica("slow", 64, ((1, 0.03), (64, 0.09))), _replica("fast", 64)
    fleet.join(slow)
    fleet.join(fast)
    assert fleet.plan_long_tail(None, DispatchSpec()) is None  # no demand yet: nothing routed
    plan = fleet.plan_long_tail(LongTailDemand(16, 112, 80, 10),
                                DispatchSpec(long_tail_batch_cap=8, objective="max"))
    assert plan.long_replicas == ("fast",)
    assert fleet.routed and fast.long_tail and not slow.long_tail
    assert [m for m in sent(fast) if isinstance(m, BatchCap)] == [BatchCap(8)]
    assert [m for m in sent(slow) if isinstance(m, BatchCap)] == []
    fleet.barriers.clear()
    fleet.queue_work([_task("long", long_tail=True), _task("short")])
    long_replica, other = fast, slow
    assert [m.prompt_id for m in sent(long_replica) if isinstance(m, Work)] == ["long"]
    assert [m.prompt_id for m in sent(other) if isinstance(m, Work)] == ["short"]
    assert fleet.barriers[-1] is False  # work is out
    long_replica.outstanding.clear()
    other.outstanding.clear()
    fleet.dispatch()
    assert fleet.barriers[-1] is True  # nothing pending, nothing out


def test_a_replica_that_leaves_is_forgotten_and_live_skips_draining_ones():
    fleet = _RecordingFleet()
    a, b = _replica("a"), _replica("b")
    fleet.join(a)
    fleet.join(b)
    b.draining = True
    assert [r.generator_id for r in fleet.live()] == ["a"]
    assert fleet.leave("a") is a
    assert fleet.leave("a") is None
    assert list(fleet.replicas) == ["b"]
