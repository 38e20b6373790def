"""The weight relay with replicas that boot from the trainer (holding no weights): each is told
the latest version at once; in a relay pool one fetches it from the trainer and the others
from it at once (it relays each chunk as it arrives); a booting replica that is not fetching
from the trainer is never named as a source; the peers of a seed that leaves are told again."""

from queue import SimpleQueue

from streamrl.messages import WeightsLoaded, WeightsNotice
from streamrl.rollout.relay import WeightRelay
from streamrl.rollout.replica import Replica
from tests.outbox import sent

V0 = WeightsNotice(0, 1000, 1, "ab")


def _booting(gid, address=""):
    return Replica(gid, "default", 8, "torch", 0, weights_address=address, without_weights=True,
                   outbox=SimpleQueue())


def test_outside_a_relay_pool_a_booting_replica_fetches_the_latest_from_the_trainer_even_at_v0():
    relay = WeightRelay()
    relay.announce(V0, [])
    a = _booting("a")
    relay.joined(a, [a])
    assert sent(a) == [V0]  # it claims v0, but holds nothing: told all the same
    holding = Replica("h", "default", 8, "torch", 0, outbox=SimpleQueue())
    relay.joined(holding, [a, holding])
    assert sent(holding) == []  # one that holds v0 is told nothing


def test_in_a_relay_pool_booting_replicas_take_one_copy_from_the_trainer_relayed_through_the_first():
    relay = WeightRelay(frozenset({"default"}))
    relay.announce(V0, [])
    a, b, c, d = _booting("a", "a:1"), _booting("b", "b:1"), _booting("c", "c:1"), _booting("d", "d:1")
    relay.joined(a, [a])
    assert [n.source for n in sent(a)] == [""] and a.told == (0, "")  # the first fetches from the trainer
    relay.joined(b, [a, b])
    assert [n.source for n in sent(b)] == ["a:1"] and b.told == (0, "a:1")  # from a, while a still fetches
    relay.joined(c, [a, b, c])
    assert [n.source for n in sent(c)] == ["a:1"]  # b fetches from a peer: it is no source yet
    relay.loaded(a, WeightsLoaded(0, 0.1, 1000, "trainer"), [a, b, c])
    assert not a.without_weights and a.policy_version == 0 and a.told is None
    relay.loaded(b, WeightsLoaded(0, 0.2, 1000, "peer"), [a, b, c])
    assert sent(b) == [] and b.told is None
    relay.joined(d, [b, c, d])  # a left; b holds it now
    assert [n.source for n in sent(d)] == ["b:1"]


def test_the_peers_of_a_seed_that_leaves_before_they_hold_the_version_are_told_again():
    relay = WeightRelay(frozenset({"default"}))
    relay.announce(V0, [])
    a, b, c = _booting("a", "a:1"), _booting("b", "b:1"), _booting("c", "c:1")
    for r, peers in ((a, [a]), (b, [a, b]), (c, [a, b, c])):
        relay.joined(r, peers)
        sent(r)
    relay.left(a, [b, c])  # a is gone
    assert [n.source for n in sent(b)] == [""] and b.told == (0, "")  # b becomes the seed
    assert [n.source for n in sent(c)] == ["b:1"]


def test_a_new_version_goes_to_the_seed_from_the_trainer_and_to_its_peers_from_the_seed_at_once():
    relay = WeightRelay(frozenset({"remote"}))
    held = [Replica(f"r{i}", "remote", 8, "torch", 0, weights_address=f"r{i}:1", outbox=SimpleQueue())
            for i in range(3)]
    plain = Replica("l0", "local", 8, "torch", 0, outbox=SimpleQueue())  # a pool without relay
    no_relay = Replica("r9", "remote", 8, "torch", 0, outbox=SimpleQueue())  # relays nothing itself
    v1 = WeightsNotice(1, 1000, 1, "cd")
    relay.announce(v1, [*held, plain, no_relay])
    assert [[n.source for n in sent(r)] for r in held] == [[""], ["r0:1"], ["r0:1"]]
    assert [n.source for n in sent(plain)] == [""] and [n.source for n in sent(no_relay)] == ["r0:1"]
