"""The trainer's start-up steps: each under its own bound, a step past it ends the process
with a line naming the step, the bound and the field to raise (N6)."""

import signal
import subprocess
import sys
import textwrap
import time

from streamrl.records import TrainerPhase
from streamrl.spec import TrainerStartupSpec
from streamrl.trainer.startup import Startup


def _bounds(**seconds: float) -> TrainerStartupSpec:
    """Bounds below the spec's floor (its fields refuse under 10 s): tests must not wait that long."""
    return TrainerStartupSpec.model_construct(**{**TrainerStartupSpec().model_dump(), **seconds})


def _process(step_s: float, load_seconds: float) -> subprocess.Popen:
    """A real process whose start-up step `Loading` holds the main thread for step_s seconds
    (as a blocking load_model does)."""
    code = textwrap.dedent(f"""
        import logging, sys, time
        from streamrl.records import TrainerPhase
        from streamrl.spec import TrainerStartupSpec
        from streamrl.trainer.startup import Startup
        logging.basicConfig(level=logging.INFO)
        bounds = TrainerStartupSpec.model_construct(load_seconds={load_seconds}, resume_seconds=3600,
                                                    rendezvous_seconds=1800)
        startup = Startup(bounds)
        startup.exit_on_signals(75)
        with startup.step(TrainerPhase.LOADING, "loadSeconds", "the model to load"):
            print("loading", flush=True)
            time.sleep({step_s})
        startup.done()
        print("started", flush=True)
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_step_past_its_bound_ends_the_process_naming_the_step_the_bound_and_the_field():
    t0 = time.monotonic()
    proc = _process(step_s=60, load_seconds=0.5)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert time.monotonic() - t0 < 30  # not the step's 60 s
    assert "started" not in out
    assert "step Loading (the model to load) took longer than its bound of 0.5 s" in err
    assert "raise spec.trainer.startup.loadSeconds" in err


def test_a_step_within_its_bound_starts():
    proc = _process(step_s=0.1, load_seconds=30)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out.split()) == (0, ["loading", "started"]), err


def test_sigterm_while_loading_ends_the_start_as_a_preemption():
    """Nothing is trained yet: it exits at once with the preempted exit code (no 143 from a
    signal that found no handler)."""
    proc = _process(step_s=60, load_seconds=120)
    assert proc.stdout.readline().strip() == "loading"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 75
    assert "SIGTERM while starting (the model to load): nothing to save" in err


def test_each_step_sets_the_phase_and_says_what_it_waits_for_and_a_finished_step_never_fires():
    phases, exits = [], []
    startup = Startup(_bounds(load_seconds=0.3, resume_seconds=0.3), phases.append, exits.append)
    assert startup.starting and startup.phase == TrainerPhase.LOADING
    with startup.step(TrainerPhase.RESUMING, "resumeSeconds", "the checkpoint of iteration 4 to load"):
        assert startup.waiting_for().startswith("the checkpoint of iteration 4 to load (0 s so far, at most 0.3 s")
    startup.done()
    time.sleep(0.5)  # past the bound: the timer was cancelled
    assert exits == [] and startup.overran is None
    assert phases == [TrainerPhase.LOADING, TrainerPhase.RESUMING]
    assert not startup.starting and startup.waiting_for() == ""


def test_an_overrun_step_exits_with_failed():
    exits = []
    startup = Startup(_bounds(resume_seconds=0.1), exit=exits.append)
    with startup.step(TrainerPhase.RESUMING, "resumeSeconds", "the checkpoint to load"):
        time.sleep(0.4)
    assert exits == [1]
    assert "spec.trainer.startup.resumeSeconds" in startup.overran
