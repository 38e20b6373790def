"""Weights are known by their published SHA-256, not only their version number: a trainer that
resumed from a checkpoint publishes again version numbers an earlier start published with
other weights. A replica that joins holding such a version is told to fetch the trainer's; one
holding the same weights, or another version, is told as before."""

from __future__ import annotations

from queue import SimpleQueue

import pytest

from streamrl.messages import WeightsNotice
from streamrl.rollout.relay import WeightRelay
from streamrl.rollout.replica import Replica

LATEST = WeightsNotice(12, 1000, 1, "aa" * 32)


def _joined(policy_version: int, sha256: str) -> list:
    relay = WeightRelay()
    relay.announce(LATEST, [])
    replica = Replica("g", "default", 8, "torch", policy_version, weights_sha256=sha256, outbox=SimpleQueue())
    relay.joined(replica, [replica])
    out = []
    while not replica.outbox.empty():
        out.append(replica.outbox.get_nowait())
    return out


@pytest.mark.parametrize("version, sha, told", [
    (12, "bb" * 32, True),   # v12 of an earlier start of the trainer: other weights
    (12, "aa" * 32, False),  # the very weights published now
    (12, "", False),         # says nothing of its weights (an older generator): trusted by version
    (9, "cc" * 32, True),    # another version: as always
    (0, "", True),           # the initial model
])
def test_a_joining_replica_fetches_the_latest_unless_it_holds_those_very_weights(version, sha, told):
    assert _joined(version, sha) == ([LATEST] if told else [])
