"""One connected generator replica as the rollout tracks it: who it is, what it holds, what it
was sent, and its outbox of messages out (domain messages; whoever carries them converts: the
trainer's servicer to gRPC, the simulator into its simulated engine)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from streamrl.messages import Hello, LatencyPoints, LoadReport


class Outbox(Protocol):
    """Where messages for a replica go: an asyncio.Queue in the trainer (its stream's writer
    awaits it), a direct delivery in the simulator."""

    def put_nowait(self, item, /) -> None: ...


SampleKey = tuple[str, int]
"""(prompt_id, sample_index): how a sample is identified, and accepted at most once."""


@dataclass
class Replica:
    generator_id: str
    pool: str
    capacity: int
    engine: str
    policy_version: int
    """The weight version it holds."""
    weights_address: str = ""
    """Where it relays the versions it holds to pool peers; empty = it does not."""
    latency_profile: LatencyPoints = ()
    """PTL(BS), from Hello, refreshed by load reports."""
    outbox: Outbox = field(kw_only=True)
    """Messages for it: Work, WeightsNotice, BatchCap; None ends its stream."""
    outstanding: set[SampleKey] = field(default_factory=set)
    """Samples assigned to it and not yet received."""
    num_samples: int = 0
    """Samples accepted from it."""
    malformed_in_a_row: int = 0
    """Malformed samples it sent since its last accepted one (refusals.MAX_MALFORMED_IN_A_ROW ends its stream)."""
    load: LoadReport | None = None
    """Its latest load report."""
    told: tuple[int, str] | None = None
    """(version, source address; "" = the trainer) it was told to fetch and has not loaded yet
    (the relay names it as a source of that version meanwhile when it fetches from the trainer)."""
    long_tail: bool = False
    """Serves the long tail (at a small batch cap) under skewness-aware dispatch."""
    draining: bool = False
    """It is leaving: assigned nothing more; what it holds it finishes."""
    skewness_bubble_s: Callable[[], float] | None = None
    """Its skewness-bubble seconds so far, read in-process (colocated); else from load reports."""
    started_unix: float = 0.0
    """When its process started (Unix seconds; 0 = unknown)."""
    hello_unix: float = 0.0
    """When its Hello arrived."""
    join_s: float | None = None
    """Process start to its first accepted sample."""
    weights_sha256: str = ""
    """SHA-256 of the published weights it said it holds (empty: the initial model)."""
    without_weights: bool = False
    """It booted from the trainer and holds no weights until it loads the version it is told of."""

    @classmethod
    def of(cls, hello: Hello, *, outbox: Outbox, hello_unix: float = 0.0) -> Replica:
        """The replica a Hello introduces (checked by the caller), its messages to go to `outbox`."""
        return cls(hello.generator_id, hello.pool, hello.capacity, hello.engine, hello.policy_version,
                   hello.weights_address, hello.latency_profile, outbox=outbox, started_unix=hello.started_unix,
                   hello_unix=hello_unix, weights_sha256=hello.weights_sha256, without_weights=hello.without_weights)

    def skewness_seconds(self) -> float:
        if self.skewness_bubble_s is not None:
            return self.skewness_bubble_s()
        return self.load.skewness_bubble_s if self.load is not None else 0.0

    def close(self) -> None:
        """End its stream (it exits, or, draining, it is done)."""
        self.outbox.put_nowait(None)
