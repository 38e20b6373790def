"""What a replica was sent: the messages in its outbox (a queue.SimpleQueue in the unit tests), in order."""

from __future__ import annotations


def sent(replica) -> list:
    """Take every message out of the replica's outbox."""
    out = []
    while not replica.outbox.empty():
        out.append(replica.outbox.get_nowait())
    return out
