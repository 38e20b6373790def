import asyncio

import pytest

from streamrl.messages import BatchCap, Draining, Hello, WeightsLoaded, WeightsNotice, Work
from streamrl.metrics import ServiceMetrics
from streamrl.rewards import RewardError
from streamrl.rollout.longtail import LongTailDemand
from streamrl.rollout.work import PromptWork, SamplingConfig
from streamrl.samples import Sample, VersionRun
from streamrl.spec import DispatchSpec
from streamrl.trainer.coordinator import Coordinator


def _coordinator(group_size=4):
    def scorer(sample, answer):
        return 1.0 if sample.completion_token_ids[0] == int(answer) else 0.0

    return Coordinator(SamplingConfig(1.0, 1.0, 16, 0), scorer, ServiceMetrics("trainer"), queue_factor=1)


def _drain(handle):
    out = []
    while not handle.outbox.empty():
        out.append(handle.outbox.get_nowait())
    return out


def _sample(prompt_id, i, token=7, gid="g"):
    return Sample(prompt_id, i, (token, 2), (-0.1, -0.2), 0, "stop", gid)


def run(coro):
    return asyncio.run(coro)


def test_prompts_are_dispatched_within_each_generators_room():
    async def go():
        c = _coordinator()
        a = c.connect(Hello("a", "p", capacity=4, engine="torch", policy_version=0))
        b = c.connect(Hello("b", "p", capacity=2, engine="torch", policy_version=0))
        c.add_prompts(0, [PromptWork(f"p{i}", i, "7", (1, 5)) for i in range(3)], group_size=4, min_policy_version=0)
        wa, wb = _drain(a), _drain(b)
        assert sum(len(w.sample_indices) for w in wa) == 4 and len(a.outstanding) == 4
        assert sum(len(w.sample_indices) for w in wb) == 2 and len(b.outstanding) == 2
        assert all(isinstance(w, Work) and w.temperature == 1.0 and w.max_new_tokens == 16 for w in wa + wb)
        assert c.status()["num_samples_pending"] == 6

    run(go())


def test_duplicate_sample_is_accepted_once():
    async def go():
        c = _coordinator(group_size=2)
        c.connect(Hello("a", "p", 8, "torch", 0))
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=0)
        assert c.on_sample("a", _sample("p0", 0)) is True
        assert c.on_sample("a", _sample("p0", 0)) is False
        assert c.on_sample("a", _sample("p0", 1, token=3)) is True
        assert c.on_sample("a", _sample("p0", 1)) is False  # after the group completed
        assert (c.counters.num_samples_accepted, c.counters.num_samples_duplicate_dropped) == (2, 2)
        [group] = await c.take_groups(0, 1, 100)
        assert [s.reward for s in group.samples] == [1.0, 0.0]
        assert group.samples[0].advantage > 0 > group.samples[1].advantage

    run(go())


def test_sample_from_dead_generator_is_redispatched_once():
    async def go():
        c = _coordinator(group_size=4)
        a = c.connect(Hello("a", "p", 4, "torch", 0))
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,))], group_size=4, min_policy_version=0)
        _drain(a)
        c.on_sample("a", _sample("p0", 0))
        c.on_sample("a", _sample("p0", 2))
        c.disconnect("a")
        assert c.counters.num_samples_redispatched == 2
        b = c.connect(Hello("b", "p", 4, "torch", 0))
        [work] = _drain(b)
        assert work.prompt_id == "p0" and sorted(work.sample_indices) == [1, 3]
        c.on_sample("b", _sample("p0", 1, gid="b"))
        c.on_sample("b", _sample("p0", 3, gid="b"))
        c.on_sample("a", _sample("p0", 1))  # a late copy from the dead replica
        [group] = await c.take_groups(0, 4, 4)
        assert [s.sample.generator_id for s in group.samples] == ["g", "b", "g", "b"]
        assert c.counters.num_samples_accepted == 4 and c.counters.num_samples_duplicate_dropped == 1
        assert c.counters.num_samples_redispatched == 2

    run(go())


def test_malformed_sample_is_rejected_and_reissued():
    async def go():
        c = _coordinator(group_size=2)
        a = c.connect(Hello("a", "p", 4, "torch", 0))
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=0)
        _drain(a)
        bad = Sample("p0", 1, (7, 2), (-0.1,), 0, "stop", "a")
        assert c.on_sample("a", bad) is False
        assert c.counters.num_samples_rejected == 1
        [work] = _drain(a)
        assert work.sample_indices == (1,)

    run(go())


def test_connect_validates_and_sends_latest_weights():
    async def go():
        c = _coordinator()
        with pytest.raises(ValueError, match="generator_id must not be empty"):
            c.connect(Hello("", "p", 4, "torch", 0))
        c.connect(Hello("a", "p", 4, "torch", 0))
        with pytest.raises(KeyError, match="connected already"):
            c.connect(Hello("a", "p", 4, "torch", 0))
        notice = WeightsNotice(3, 100, 1, "ff")
        c.announce(notice)
        late = c.connect(Hello("b", "p", 4, "torch", 0))
        assert _drain(late) == [notice]

    run(go())


def test_take_groups_waits_for_enough_samples():
    async def go():
        c = _coordinator(group_size=2)
        c.connect(Hello("a", "p", 8, "torch", 0))
        c.add_prompts(0, [PromptWork(f"p{i}", i, "7", (1,)) for i in range(3)], group_size=2, min_policy_version=0)
        waiter = asyncio.ensure_future(c.take_groups(0, 4, 4))
        for i in (0, 1):
            c.on_sample("a", _sample("p0", i))
        await asyncio.sleep(0)
        assert not waiter.done()
        for i in (0, 1):
            c.on_sample("a", _sample("p1", i))
        groups = await asyncio.wait_for(waiter, 1)
        assert [g.prompt_id for g in groups] == ["p0", "p1"]

    run(go())


def test_groups_are_taken_by_iteration():
    async def go():
        c = _coordinator(group_size=2)
        c.connect(Hello("a", "p", 8, "torch", 0))
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=0)
        c.add_prompts(1, [PromptWork("p1", 1, "7", (1,))], group_size=2, min_policy_version=0)
        for i in (0, 1):
            c.on_sample("a", _sample("p1", i))
        waiter = asyncio.ensure_future(c.take_groups(0, 2, 2))
        await asyncio.sleep(0)
        assert not waiter.done()  # p1 belongs to iteration 1
        assert [g.prompt_id for g in await c.take_groups(1, 2, 2)] == ["p1"]
        for i in (0, 1):
            c.on_sample("a", _sample("p0", i))
        assert [g.prompt_id for g in await asyncio.wait_for(waiter, 1)] == ["p0"]

    run(go())


def test_too_stale_sample_is_dropped_at_consumption_and_reissued():
    async def go():
        c = _coordinator(group_size=2)
        a = c.connect(Hello("a", "p", 8, "torch", 0))
        c.announce(WeightsNotice(2, 100, 1, "ff"))
        c.add_prompts(3, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=1)
        _drain(a)
        c.on_sample("a", Sample("p0", 0, (7, 2), (-0.1, -0.2), 1, "stop", "a"))  # v1: fine on arrival
        c.on_sample("a", Sample("p0", 1, (7, 2), (-0.1, -0.2), 2, "stop", "a"))
        waiter = asyncio.ensure_future(c.take_groups(3, 2, 2, min_policy_version=2))  # the learner moved on
        await asyncio.sleep(0)
        assert not waiter.done()
        assert c.counters.num_samples_stale_dropped == 1 and c.counters.num_samples_refused == {"stale": 1}
        [work] = _drain(a)
        assert work.sample_indices == (0,) and work.min_policy_version == 2
        c.on_sample("a", Sample("p0", 0, (7, 2), (-0.1, -0.2), 2, "stop", "a"))
        [group] = await asyncio.wait_for(waiter, 1)
        assert [s.sample.policy_version for s in group.samples] == [2, 2]
        assert c.counters.num_samples_accepted == 3

    run(go())


def test_sample_too_stale_on_arrival_is_refused_and_reissued_before_it_joins_a_group():
    async def go():
        c = _coordinator(group_size=2)
        a = c.connect(Hello("a", "p", 8, "torch", 0))
        c.announce(WeightsNotice(2, 100, 1, "ff"))
        c.add_prompts(3, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=2)
        _drain(a)
        assert c.on_sample("a", Sample("p0", 0, (7, 2), (-0.1, -0.2), 1, "stop", "a")) is False  # v1 < v2
        assert c.counters.num_samples_stale_dropped == 1 and c.counters.num_samples_accepted == 0
        [work] = _drain(a)
        assert work.sample_indices == (0,) and work.min_policy_version == 2
        assert c.on_sample("a", Sample("p0", 0, (7, 2), (-0.1, -0.2), 2, "stop", "a")) is True

    run(go())


def test_an_in_flight_sample_is_as_stale_as_its_first_token_however_new_its_last():
    """Tokens of v1 then v2 (a version loaded while it ran): its policy_version is 1, and
    staleness counts from it, on arrival and at consumption."""
    def mixed(i: int, first: int, last: int) -> Sample:
        return Sample("p0", i, (7, 2, 2), (-0.1, -0.2, -0.3), first, "stop", "a",
                      version_runs=(VersionRun(first, 1), VersionRun(last, 2)))

    async def go():
        c = _coordinator(group_size=2)
        a = c.connect(Hello("a", "p", 8, "torch", 0))
        c.announce(WeightsNotice(2, 100, 1, "ff"))
        c.add_prompts(3, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=2)
        _drain(a)
        assert c.on_sample("a", mixed(0, 1, 2)) is False  # its last tokens are v2, its first v1 < v2
        assert c.counters.num_samples_refused == {"stale": 1}
        [work] = _drain(a)
        assert work.sample_indices == (0,)
        assert c.on_sample("a", mixed(0, 2, 3)) is False  # v3 is not published yet
        assert c.counters.num_samples_refused == {"stale": 1, "future_version": 1}
        c.announce(WeightsNotice(3, 100, 1, "ff"))
        _drain(a)
        assert c.on_sample("a", mixed(0, 2, 3)) is True
        assert c.on_sample("a", mixed(1, 2, 3)) is True
        # The learner moves on to v3: both are one version behind by their first tokens, though their
        # last ones are v3's: dropped at consumption.
        waiter = asyncio.ensure_future(c.take_groups(3, 2, 2, min_policy_version=3))
        await asyncio.sleep(0)
        assert not waiter.done()
        assert c.counters.num_samples_stale_dropped == 3
        waiter.cancel()

    run(go())


def _relay_coordinator():
    c = Coordinator(SamplingConfig(1.0, 1.0, 16, 0), lambda s, a: 0.0, ServiceMetrics("trainer"),
                    relay_pools=frozenset({"remote"}))
    return c


def test_relay_pool_gets_one_copy_from_the_trainer_and_the_rest_from_the_seed():
    async def go():
        c = _relay_coordinator()
        seed = c.connect(Hello("r0", "remote", 4, "torch", 0, weights_address="10.0.0.1:7000"))
        peers = [c.connect(Hello(f"r{i}", "remote", 4, "torch", 0, weights_address=f"10.0.0.{i + 1}:7000"))
                 for i in (1, 2)]
        local = c.connect(Hello("l0", "local", 4, "torch", 0))  # pool without relay
        notice = WeightsNotice(1, 100, 1, "ab")
        c.announce(notice)
        assert _drain(seed) == [notice]  # from the trainer
        assert _drain(local) == [notice]
        for p in peers:  # from the seed, at once: it relays each chunk as it arrives
            [told] = _drain(p)
            assert told.policy_version == 1 and told.source == "10.0.0.1:7000"
        c.loaded("r0", WeightsLoaded(1, 0.0, 0, "trainer"))
        assert all(_drain(p) == [] for p in peers)
        late = c.connect(Hello("r9", "remote", 4, "torch", 0, weights_address="10.0.0.9:7000"))
        assert _drain(late)[0].source == "10.0.0.1:7000"

    run(go())


def test_relay_seed_that_dies_before_loading_is_replaced():
    async def go():
        c = _relay_coordinator()
        seed = c.connect(Hello("r0", "remote", 4, "torch", 0, weights_address="a:1"))
        peer = c.connect(Hello("r1", "remote", 4, "torch", 0, weights_address="b:1"))
        c.announce(WeightsNotice(1, 100, 1, "ab"))
        _drain(seed)
        assert [n.source for n in _drain(peer)] == ["a:1"]
        c.disconnect("r0")
        [told] = _drain(peer)
        assert told.source == ""  # now the seed itself, fetching from the trainer

    run(go())


def test_long_tail_prompts_go_to_long_tail_replicas_longest_first():
    async def go():
        c = _coordinator(group_size=2)
        a = c.connect(Hello("a", "p", 8, "torch", 0))
        b = c.connect(Hello("b", "p", 8, "torch", 0))
        c.route_long_tail({"a"}, batch_cap=2)
        assert _drain(a) == [BatchCap(2)] and _drain(b) == []
        predicted = {"s1": (5.0, False), "L1": (90.0, True), "s2": (9.0, False), "L2": (60.0, True)}
        prompts = [PromptWork(pid, i, "7", (1,), length, long_tail)
                   for i, (pid, (length, long_tail)) in enumerate(predicted.items())]
        c.add_prompts(0, prompts, group_size=2, min_policy_version=0)
        to_a, to_b = _drain(a), _drain(b)
        assert [(w.prompt_id, w.priority) for w in to_a] == [("L1", 90.0), ("L2", 60.0)]
        assert [(w.prompt_id, w.priority) for w in to_b] == [("s2", 9.0), ("s1", 5.0)]
        c.route_long_tail(set(), batch_cap=2)  # plan without a long tail: a back to full batch
        assert _drain(a) == [BatchCap(0)]

    run(go())


def test_late_binding_gives_the_longest_waiting_prompt_to_the_replica_that_frees_first():
    async def go():
        c = _coordinator(group_size=4)  # queue_factor 1: a replica holds one batch
        a = c.connect(Hello("a", "p", 4, "torch", 0))
        b = c.connect(Hello("b", "p", 4, "torch", 0))
        lengths = {"p0": 10.0, "p1": 80.0, "p2": 5.0, "p3": 60.0, "p4": 40.0}
        prompts = [PromptWork(pid, i, "7", (1,), n) for i, (pid, n) in enumerate(lengths.items())]
        c.add_prompts(0, prompts, group_size=4, min_policy_version=0)
        assert [w.prompt_id for w in _drain(a)] == ["p1"] and [w.prompt_id for w in _drain(b)] == ["p3"]
        for i in range(4):  # b finishes first: it takes the longest still waiting
            c.on_sample("b", _sample("p3", i, gid="b"))
        assert [w.prompt_id for w in _drain(b)] == ["p4"] and _drain(a) == []
        for i in range(4):
            c.on_sample("a", _sample("p1", i, gid="a"))
        assert [w.prompt_id for w in _drain(a)] == ["p0"]
        assert c.status()["num_samples_pending"] == 4  # p2, for whichever frees next

    run(go())


def test_early_binding_hands_each_replica_its_share_up_front():
    async def go():
        c = Coordinator(SamplingConfig(1.0, 1.0, 16, 0), lambda s, a: 0.0, ServiceMetrics("trainer"), queue_factor=4)
        a = c.connect(Hello("a", "p", 4, "torch", 0))
        b = c.connect(Hello("b", "p", 4, "torch", 0))
        c.add_prompts(0, [PromptWork(f"p{i}", i, "7", (1,)) for i in range(8)], group_size=4, min_policy_version=0)
        assert len(a.outstanding) == len(b.outstanding) == 16
        assert c.status()["num_samples_pending"] == 0

    run(go())


def _raising_coordinator(on_reward_error: str):
    def scorer(sample, answer):
        if sample.completion_token_ids[0] == 13:
            raise RewardError(f"reward.function 'mine:f' raised on prompt {sample.prompt_id}: ValueError: 13")
        return 1.0

    return Coordinator(SamplingConfig(1.0, 1.0, 16, 0), scorer, ServiceMetrics("trainer"), queue_factor=1,
                       on_reward_error=on_reward_error)


def test_a_raising_reward_fails_the_run_with_the_error_and_loses_no_sample():
    async def go():
        c = _raising_coordinator("fail")
        a = c.connect(Hello("a", "p", 4, "torch", 0))
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=0)
        waiter = asyncio.ensure_future(c.take_groups(0, 2, 2))
        assert c.on_sample("a", _sample("p0", 0)) is True
        assert c.on_sample("a", _sample("p0", 1, token=13)) is False
        # Nothing was counted or forgotten: the unscored sample is still owed by its replica.
        assert c.counters.num_samples_accepted == 1 and ("p0", 1) in a.outstanding
        with pytest.raises(RewardError, match="mine:f.*p0.*ValueError: 13"):
            await asyncio.wait_for(waiter, 1)
        with pytest.raises(RewardError):  # and whoever asks next
            await c.take_groups(0, 2, 2)

    run(go())


def test_a_raising_reward_scores_zero_when_the_spec_says_so():
    async def go():
        c = _raising_coordinator("zero")
        c.connect(Hello("a", "p", 4, "torch", 0))
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,))], group_size=2, min_policy_version=0)
        assert c.on_sample("a", _sample("p0", 0)) is True
        assert c.on_sample("a", _sample("p0", 1, token=13)) is True
        [group] = await asyncio.wait_for(c.take_groups(0, 2, 2), 1)
        assert [s.reward for s in group.samples] == [1.0, 0.0]
        assert c.counters.num_samples_reward_failed == 1 and c.counters.num_samples_accepted == 2

    run(go())


def test_a_draining_generator_finishes_what_it_holds_then_its_stream_ends_and_the_long_tail_is_replanned():
    async def go():
        demand = [None]
        c = Coordinator(SamplingConfig(1.0, 1.0, 16, 0), lambda s, a: 1.0, ServiceMetrics("trainer"), queue_factor=1,
                        dispatch=DispatchSpec(long_tail_batch_cap=8, objective="max"), demand=lambda: demand[0])
        slow = c.connect(Hello("slow", "p", 64, "torch", 0, latency_profile=((1, 0.03), (64, 0.09))))
        fast = c.connect(Hello("fast", "p", 64, "torch", 0, latency_profile=((1, 0.011), (64, 0.074))))
        demand[0] = LongTailDemand(16, 112, 80, 10)  # the planner's, once an iteration's lengths are predicted
        c.add_prompts(0, [PromptWork("p0", 0, "7", (1,), predicted_length=90, long_tail=True)], group_size=2,
                      min_policy_version=0)
        assert fast.long_tail and not slow.long_tail and ("p0", 0) in fast.outstanding
        _drain(fast)
        c.on_message("fast", Draining("SIGTERM"))
        assert fast.draining and not fast.long_tail and BatchCap(0) in _drain(fast)  # replanned without it
        assert not c.routed  # one replica taking work: no long tail of its own
        c.on_sample("fast", _sample("p0", 0, gid="fast"))
        assert None not in _drain(fast)  # p0's second sample is still out
        c.on_sample("fast", _sample("p0", 1, gid="fast"))
        assert _drain(fast) == [None]  # released: its stream ends
        c.disconnect("fast")
        assert list(c.replicas) == ["slow"] and c.counters.num_samples_redispatched == 0

    run(go())
