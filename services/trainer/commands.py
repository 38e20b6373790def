"""What the leader (rank 0) tells every rank to run, one command at a time: each rank gets its
own copy (Accumulate carries that rank's share), and every rank runs it to its end together
(the collectives inside line up). Plain frozen records, pickled by the rank group's scatter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from streamrl.samples import ScoredSample


@dataclass(frozen=True)
class Accumulate:
    """Forward/backward on this rank's share; gradients accumulate until Step."""

    share: list[tuple[tuple[int, ...], ScoredSample]]
    """(prompt token ids, scored sample) pairs, this rank's."""
    num_samples_in_step: int
    """Samples in the whole optimizer step (the loss's fixed weight is 1 / this)."""
    num_micro_batches: int
    """Every rank runs this many (a short share pads with zero-weight ones)."""


@dataclass(frozen=True)
class Step:
    """Clip gradients and take the optimizer step."""


@dataclass(frozen=True)
class Gather:
    """Gather the whole parameters to rank 0 (to publish them)."""


@dataclass(frozen=True)
class Save:
    """Write this rank's part of a checkpoint into `path` (in the background)."""

    path: str


@dataclass(frozen=True)
class Load:
    """Take this rank's part of the checkpoint in `path`."""

    path: str


@dataclass(frozen=True)
class Stop:
    """Leave follow() once this rank's part of a checkpoint is on disk."""


Command = Accumulate | Step | Gather | Save | Load | Stop

CommandT = TypeVar("CommandT", bound=Command)
"""Any one kind of command: what the leader sends is what the rank gets back (Ranks.send)."""
