"""How long a generator waits before dialling its trainer again after the stream broke:
exponential backoff with full jitter (each wait drawn uniformly between zero and a cap that
doubles from `initialBackoffSeconds` up to `maxBackoffSeconds`), until `giveUpAfterSeconds`
have passed since the break (unset: for ever). Knows nothing of gRPC or of the trainer."""

from __future__ import annotations

import math
import random

from streamrl.spec import ReconnectSpec


class Backoff:
    """The waits between attempts after one break (a new break starts a new Backoff)."""

    def __init__(self, spec: ReconnectSpec, broke_at: float, rng: random.Random | None = None):
        self.spec = spec
        self.broke_at = broke_at
        """When the stream broke (monotonic seconds): the give-up deadline counts from here."""
        self.rng = rng or random.Random()
        self.attempts = 0
        """Waits handed out so far (each precedes an attempt)."""

    def cap(self, attempt: int) -> float:
        """The upper bound, in seconds, of the wait before the `attempt`-th attempt (0-based)."""
        return min(self.spec.max_backoff_seconds, self.spec.initial_backoff_seconds * 2.0 ** min(attempt, 64))

    def left_s(self, now: float) -> float:
        """Seconds until the give-up deadline (negative once past it; inf without one)."""
        if self.spec.give_up_after_seconds is None:
            return math.inf
        return self.spec.give_up_after_seconds - (now - self.broke_at)

    def next_wait(self, now: float) -> float | None:
        """Seconds to wait before the next attempt (never past the give-up deadline); None
        once `giveUpAfterSeconds` (when set) have passed since the break: give up."""
        left = self.left_s(now)
        if left <= 0:
            return None
        wait = self.rng.uniform(0.0, self.cap(self.attempts))
        self.attempts += 1
        return min(wait, left)
