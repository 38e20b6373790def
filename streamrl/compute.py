"""Each process runs its torch compute on one thread, the compute thread: a generator's
engine loop, a trainer's learner, a colocated trainer's both.

torch's CPU kernels run their parallel regions on OpenMP (libgomp), and every thread that
enters a region with more than one OpenMP thread keeps a team of its own for as long as it
lives. Once a process's teams hold more threads than it has cores, libgomp's workers stop
spin-waiting between regions and sleep, and each of a decode step's hundreds of small
regions pays a wake-up. On two cores with two torch threads, the tiny model decoded a batch of
64 in 3.5-4.2 ms per step and trained a 32 x 23-token micro-batch in 30-35 ms when its engine
and its learner ran on two threads; on one thread: 1.6-1.75 ms and 14-15.5 ms. Neither
OMP_WAIT_POLICY nor GOMP_SPINCOUNT lifts the throttle.

So `set_threads(n)` (at start-up, by the command line) gives every thread one OpenMP thread,
and the compute thread, started by `start_thread` or `executor`, n. A process that never
calls `set_threads` keeps torch's own settings. MKL reads its default from the environment
before any of this runs: `streamrl run` starts its processes, and the operator its pods,
with MKL_NUM_THREADS at 1, so that a matrix product on another thread does not start a team
of MKL's own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")

_threads: int | None = None
"""The compute thread's OpenMP threads (set_threads); None: torch's settings stay as they are."""


def set_threads(n: int) -> None:
    """n OpenMP threads for the compute thread, one for every other thread (the caller's too)."""
    if n < 1:
        raise ValueError(f"threads: {n}; must be at least 1")
    global _threads
    _threads = n
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)


def _claim() -> None:
    """On the new compute thread: its own OpenMP (and MKL) thread count. torch applies the
    process-wide count to a thread lazily, at its first parallel call, so that happens first."""
    if _threads is not None:
        torch.get_num_threads()
        torch.set_num_threads(_threads)


def _release() -> None:
    """On the caller's thread, once the compute thread has its count: the process-wide count
    back to one (torch.set_num_threads sets both the calling thread's and the process's)."""
    if _threads is not None:
        torch.set_num_threads(1)


def restore_threads(n: int) -> None:
    """On a thread whose OpenMP count foreign code changed (vLLM's CPU kernels do, on the engine
    thread): its count back to n. torch.set_num_threads also sets the process's count, which
    set_threads keeps at one for every other thread, so a helper thread puts that back."""
    torch.set_num_threads(n)
    if _threads is not None:
        helper = threading.Thread(target=_release, name="restore-threads")
        helper.start()
        helper.join()


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Run `target` on a new daemon thread, the process's compute thread."""
    claimed = threading.Event()

    def run() -> None:
        try:
            _claim()
        finally:
            claimed.set()
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    claimed.wait()
    _release()
    return thread


def run(fn: Callable[..., T], *args, thread: Executor | None = None, name: str = "compute") -> T:
    """fn(*args) on `thread` (a compute thread the caller holds), else on one of its own for this call."""
    if thread is not None:
        return thread.submit(fn, *args).result()
    with executor(name) as own:
        return own.submit(fn, *args).result()


def executor(name: str) -> ThreadPoolExecutor:
    """The process's compute thread as a one-thread executor (its thread starts now)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix=name)
    pool.submit(_claim).result()
    _release()
    return pool
