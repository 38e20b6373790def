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
    def __init__(self, demand=lambda: None, dispatch=None):
        super().__init__(WorkQueue(SamplingConfig(1.0, 1.0, 16, 0), RolloutCounters(), 1.0), WeightRelay(),
                         GroupBook(), dispatch, demand)
        self.barriers: list[bool] = []
        self.released_ids: list[str] = []

    def at_barrier(self, barrier: bool) -> None:
        self.barriers.append(barrier)

    def released(self, replica: Replica) -> None:
        self.released_ids.append(replica.generator_id)


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


def test_a_draining_replica_is_released_once_what_it_holds_has_arrived():
    fleet = _RecordingFleet()
    a, b = _replica("a", capacity=4), _replica("b", capacity=4)
    fleet.join(a)
    fleet.queue_work([_task("p0", 4)])
    fleet.join(b)
    assert len(a.outstanding) == 4 and not b.outstanding
    assert fleet.drain("a") is a and a.draining
    assert fleet.drain("a") is None and fleet.drain("nobody") is None  # once; unknown ids are ignored
    assert fleet.released_ids == []  # it still holds p0
    fleet.queue_work([_task("p1", 4)])
    assert {k[0] for k in b.outstanding} == {"p1"}  # nothing more for a
    for key in sorted(a.outstanding):
        fleet.release_if_drained(a)
        assert fleet.released_ids == []
        a.outstanding.discard(key)
    fleet.release_if_drained(a)
    assert fleet.released_ids == ["a"]
    fleet.leave("a")
    fleet.release_if_drained(a)  # gone: not released again
    assert fleet.released_ids == ["a"]


def test_an_idle_replica_that_drains_is_released_at_once():
    fleet = _RecordingFleet()
    fleet.join(_replica("a"))
    fleet.drain("a")
    assert fleet.released_ids == ["a"]


def test_membership_changes_replan_the_long_tail_for_the_demand_it_was_given():
    demand: list[LongTailDemand | None] = [None]
    fleet = _RecordingFleet(lambda: demand[0], DispatchSpec(long_tail_batch_cap=8, objective="max"))
    slow, fast = _replica("slow", 64, ((1, 0.03), (64, 0.09))), _replica("fast", 64)
    fleet.join(slow)
    fleet.join(fast)
    assert not fleet.routed and not fast.long_tail  # no demand: no plan
    demand[0] = LongTailDemand(16, 112, 80, 10)
    fleet.join(slow2 := _replica("slow2", 64, ((1, 0.03), (64, 0.09))))  # a join replans for the demand of now
    assert fleet.routed and fast.long_tail and not slow.long_tail and not slow2.long_tail
    assert sent(fast)[-1] == BatchCap(8)
    fleet.drain("fast")  # draining: planned without it, back to full capacity
    assert not fast.long_tail and BatchCap(0) in sent(fast)
    assert [r.generator_id for r in fleet.replicas.values() if r.long_tail] != []  # another takes the tail
    fleet.leave("slow")
    fleet.leave("slow2")  # only the draining one is left: no plan, nothing routed
    assert not fleet.routed


def test_an_iterations_prompts_go_out_longest_first_under_a_plan_for_its_demand():
    demand: list[LongTailDemand | None] = [None]
    fleet = _RecordingFleet(lambda: demand[0], DispatchSpec(long_tail_batch_cap=8, objective="max"))
    slow, fast = _replica("slow", 64, ((1, 0.03), (64, 0.09))), _replica("fast", 64)
    fleet.join(slow)
    fleet.join(fast)
    demand[0] = LongTailDemand(4, 8, 80, 10)  # as IterationPlanner.predict leaves it, before the prompts go out
    prompts = [PromptWork("short", 0, "", (1,), predicted_length=10),
               PromptWork("long", 1, "", (1,), predicted_length=90, long_tail=True),
               PromptWork("mid", 2, "", (1,), predicted_length=20)]
    fleet.add_prompts(3, prompts, 4, 2)
    assert fast.long_tail and fleet.routed
    assert [m.prompt_id for m in sent(fast) if isinstance(m, Work)] == ["long"]
    assert [m.prompt_id for m in sent(slow) if isinstance(m, Work)] == ["mid", "short"]
    task = fleet.book.get("long")
    assert (task.iteration, task.group_size, task.min_policy_version) == (3, 4, 2)
