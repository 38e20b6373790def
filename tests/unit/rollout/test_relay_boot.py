"""The weight relay with replicas that boot from the trainer (holding no weights): each is told
the latest version at once; in a relay pool one fetches it from the trainer and the others
from it once it holds it; a booting replica is never named as a source; a seed that leaves
first is replaced."""

from streamrl.messages import WeightsLoaded, WeightsNotice
from streamrl.rollout.relay import WeightRelay
from streamrl.rollout.replica import Replica
from tests.outbox import sent

V0 = WeightsNotice(0, 1000, 1, "ab")


def _booting(gid, address=""):
    return Replica(gid, "default", 8, "torch", 0, weights_address=address, without_weights=True)


def test_outside_a_relay_pool_a_booting_replica_fetches_the_latest_from_the_trainer_even_at_v0():
    relay = WeightRelay()
    relay.announce(V0, [])
    a = _booting("a")
    relay.joined(a, [a])
    assert sent(a) == [V0]  # it claims v0, but holds nothing: told all the same
    holding = Replica("h", "default", 8, "torch", 0)
    relay.joined(holding, [a, holding])
    assert sent(holding) == []  # one that holds v0 is told nothing


def test_in_a_relay_pool_booting_replicas_take_one_copy_from_the_trainer_then_from_each_other():
    relay = WeightRelay(frozenset({"default"}))
    relay.announce(V0, [])
    a, b, c = _booting("a", "a:1"), _booting("b", "b:1"), _booting("c", "c:1")
    relay.joined(a, [a])
    assert [n.source for n in sent(a)] == [""]  # the first fetches from the trainer
    relay.joined(b, [a, b])
    assert sent(b) == [] and b.awaiting_weights == 0  # a fetches it: b waits, a booting peer is no source
    relay.loaded(a, WeightsLoaded(0, 0.1, 1000, "trainer"), [a, b])
    assert [n.source for n in sent(b)] == ["a:1"]
    assert not a.without_weights and a.policy_version == 0
    relay.joined(c, [a, b, c])
    assert [n.source for n in sent(c)] == ["a:1"]  # a holds it now: straight from a


def test_a_booting_seed_that_leaves_before_it_holds_the_version_is_replaced():
    relay = WeightRelay(frozenset({"default"}))
    relay.announce(V0, [])
    a, b = _booting("a", "a:1"), _booting("b", "b:1")
    relay.joined(a, [a])
    relay.joined(b, [a, b])
    assert sent(b) == []
    relay.left("default", [b])  # a is gone
    assert [n.source for n in sent(b)] == [""] and b.awaiting_weights is None
