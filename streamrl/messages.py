"""The messages of the trainer-generator stream and of the ranker, in domain form. Knows no
protobuf: streamrl.wire converts at the edges, and both ends' queues carry these.

Generator -> trainer: Hello (first), Sample (streamrl.samples), LoadReport, WeightsLoaded,
Draining. Trainer -> generator: Welcome (first), Work, WeightsNotice, BatchCap.
"""

from __future__ import annotations

from dataclasses import dataclass

LatencyPoints = tuple[tuple[int, float], ...]
"""PTL(BS): (batch size, seconds per decode step) pairs, ascending batch size."""


@dataclass(frozen=True)
class Hello:
    """A replica introduces itself (the first message of its stream)."""

    generator_id: str
    pool: str
    capacity: int
    """Sequences it decodes at once at most."""
    engine: str
    policy_version: int
    """The weight version it holds."""
    weights_address: str = ""
    """host:port where it relays the versions it holds to pool peers; empty = it does not."""
    latency_profile: LatencyPoints = ()
    started_unix: float = 0.0
    """When its process started (Unix seconds; 0 = unknown), for its time to join."""
    weights_sha256: str = ""
    """SHA-256 of the weights it holds as published (empty = the initial model)."""
    without_weights: bool = False
    """It booted from the trainer and holds no weights yet (policy_version names no model)."""


@dataclass(frozen=True)
class Welcome:
    """The trainer's answer to Hello."""

    run_id: str
    policy_version: int
    """The latest version the trainer publishes."""
    incarnation: int = 0
    """Starts of this run's trainer so far, minus one."""


@dataclass(frozen=True)
class LoadReport:
    """A replica's load, every half second or so."""

    num_running: int
    num_waiting: int
    num_generated_tokens: int
    """Since it started."""
    tokens_per_s: float
    """Since its previous report."""
    latency_profile: LatencyPoints = ()
    skewness_bubble_s: float = 0.0
    """Seconds decoded in a skewness bubble since it started."""


@dataclass(frozen=True)
class WeightsLoaded:
    """A replica swapped in a version."""

    policy_version: int
    sync_s: float
    """Seconds from the notice to the swap."""
    size_bytes: int
    source: str
    """Where the bytes came from: trainer | peer | local."""


@dataclass(frozen=True)
class Draining:
    """A replica is leaving: assign it nothing more; it finishes what it holds."""

    reason: str = ""


@dataclass(frozen=True)
class BatchCap:
    """Tell a replica to decode at most this many sequences at once (0 = its capacity)."""

    max_batch_size: int


@dataclass(frozen=True)
class Work:
    """Samples of one prompt to generate (the domain form of an Assign)."""

    prompt_id: str
    prompt_token_ids: tuple[int, ...]
    """[P] prompt ids, BOS included."""
    sample_indices: tuple[int, ...]
    """Which samples of the group to generate."""
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    """Sample i uses seed + i."""
    min_policy_version: int
    """Do not start before holding this weight version."""
    priority: float = 0.0
    """Higher starts first."""
    incarnation: int = 0
    """The trainer incarnation that handed it out; its samples carry it back."""


@dataclass(frozen=True)
class WeightsNotice:
    """A new weight version is available to fetch."""

    policy_version: int
    size_bytes: int
    num_chunks: int
    sha256: str
    """Hex SHA-256 of the whole serialized version."""
    source: str = ""
    """host:port to fetch from; empty = the trainer."""


@dataclass(frozen=True)
class LengthObservation:
    """Output lengths the policy produced for a prompt (what the ranker learns from)."""

    prompt_key: str
    """Stable id of the prompt across the run (its dataset index)."""
    text: str
    policy_version: int
    lengths: tuple[int, ...]
