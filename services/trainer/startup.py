"""A trainer's start-up steps (loading the model, resuming a checkpoint), each under its own
bound (spec.trainer.startup): the phase /status and /readyz tell meanwhile, and a step past
its bound ends the process with a line naming the step, the bound and the field to raise.
Knows neither models nor checkpoints: the steps are the caller's."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from streamrl.records import TrainerPhase
from streamrl.service import ExitCode
from streamrl.spec import TrainerStartupSpec

log = logging.getLogger("streamrl.trainer")

FIELD = "spec.trainer.startup"


def _exit(code: int) -> None:
    """End the process now: the step that overran holds the main thread (a blocking load)."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(code)


class Startup:
    """The start in progress: its phase and step, each step watched by a timer thread."""

    def __init__(self, bounds: TrainerStartupSpec, on_phase: Callable[[TrainerPhase], None] = lambda phase: None,
                 exit: Callable[[int], None] = _exit):
        """`on_phase`: told each phase as it begins (the phase gauge); `exit`: ends the process
        with a code (tests give their own)."""
        self.bounds = bounds
        self.on_phase = on_phase
        self.exit = exit
        self.phase: TrainerPhase | None = TrainerPhase.LOADING
        """The start-up phase; None once started (the train loop has the phase from then on)."""
        self.what = "the model to load"
        self.since = time.monotonic()
        self.bound_s = 0.0
        self.overran: str | None = None
        """The log line of a step that overran its bound (set before exit is called)."""
        on_phase(self.phase)

    @property
    def starting(self) -> bool:
        return self.phase is not None

    @contextlib.contextmanager
    def step(self, phase: TrainerPhase, field: str, what: str) -> Iterator[None]:
        """Run the body as the step `phase` (`what` it waits for, in words) under the bound
        `field` of TrainerStartupSpec (its camelCase name): past it, the process ends with
        ExitCode.FAILED."""
        bound = getattr(self.bounds, _snake(field))
        self.phase, self.what, self.since, self.bound_s = phase, what, time.monotonic(), float(bound)
        self.on_phase(phase)
        timer = threading.Timer(bound, self._overrun, (phase, what, bound, field))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _overrun(self, phase: TrainerPhase, what: str, bound: float, field: str) -> None:
        self.overran = (f"trainer start-up: step {phase.value} ({what}) took longer than its bound of {bound:g} s "
                        f"({FIELD}.{field}); stopping. If it needs longer (a large model or checkpoint on slow "
                        f"storage), raise {FIELD}.{field}")
        log.error("%s", self.overran)
        self.exit(ExitCode.FAILED)

    def waiting_for(self) -> str:
        """What the start waits for, for /readyz ("" once started)."""
        if self.phase is None:
            return ""
        waited = time.monotonic() - self.since
        bound = f", at most {self.bound_s:g} s" if self.bound_s else ""
        return f"{self.what} ({waited:.0f} s so far{bound})"

    def done(self) -> None:
        """Started: the train loop has the phase from here on."""
        self.phase = None

    def exit_on_signals(self, preempted_exit_code: int) -> None:
        """Until the service's own handlers replace these (Service.run): SIGTERM or SIGINT
        ends the start at once. Nothing is trained yet, so nothing is saved; SIGTERM exits with
        `preempted_exit_code` (128 + SIGTERM where that is 0), as a preemption would."""
        if threading.current_thread() is not threading.main_thread():
            return

        def stop(signum: int, frame: object) -> None:
            log.warning("trainer: %s while starting (%s): nothing to save, stopping",
                        signal.Signals(signum).name, self.what)
            if signum == signal.SIGTERM:
                self.exit(preempted_exit_code or 128 + signal.SIGTERM)
            else:
                self.exit(ExitCode.INTERRUPTED)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)


def _snake(field: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in field)
