"""The compute thread (streamrl.compute): after set_threads(n), torch runs on n threads there
and on one everywhere else: the thread that started it, threads started later, helpers of the
event loop. Each case runs in a process of its own: torch's thread counts are process-wide."""

import json
import subprocess
import sys
import textwrap

import pytest


def _counts(body: str) -> dict[str, int]:
    script = textwrap.dedent("""
        import json, threading
        from concurrent.futures import ThreadPoolExecutor
        import torch
        from streamrl import compute
        def count_on_new_thread():
            return ThreadPoolExecutor(1).submit(torch.get_num_threads).result()
        counts = {}
    """) + textwrap.dedent(body) + "\nprint(json.dumps(counts))\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_executor_runs_on_the_threads_set_and_every_other_thread_on_one():
    counts = _counts("""
        torch.ones(1 << 16).mul_(2)  # the main thread has run torch already, as after loading a model
        compute.set_threads(2)
        pool = compute.executor("learner")
        counts["compute"] = pool.submit(torch.get_num_threads).result()
        counts["compute_name"] = pool.submit(lambda: threading.current_thread().name.startswith("learner")).result()
        counts["main"] = torch.get_num_threads()
        counts["other"] = count_on_new_thread()
        counts["compute_after"] = pool.submit(torch.get_num_threads).result()
    """)
    assert counts == {"compute": 2, "compute_name": True, "main": 1, "other": 1, "compute_after": 2}


def test_a_started_thread_is_the_compute_thread():
    counts = _counts("""
        compute.set_threads(3)
        seen = {}
        done = threading.Event()
        def engine():
            seen["n"] = torch.get_num_threads()
            seen["name"] = threading.current_thread().name
            done.set()
        compute.start_thread(engine, "engine").join(10)
        counts["compute"] = seen["n"]
        counts["is_engine"] = seen["name"] == "engine"
        counts["main"] = torch.get_num_threads()
        counts["other"] = count_on_new_thread()
    """)
    assert counts == {"compute": 3, "is_engine": True, "main": 1, "other": 1}


def test_without_set_threads_torch_keeps_its_own_counts():
    counts = _counts("""
        torch.set_num_threads(2)
        pool = compute.executor("learner")
        counts["compute"] = pool.submit(torch.get_num_threads).result()
        counts["main"] = torch.get_num_threads()
    """)
    assert counts == {"compute": 2, "main": 2}


def test_set_threads_refuses_fewer_than_one():
    from streamrl import compute

    with pytest.raises(ValueError, match="threads: 0; must be at least 1"):
        compute.set_threads(0)


def test_run_uses_the_thread_given_else_one_of_its_own_for_the_call():
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from streamrl import compute

    def where(tag):
        return tag, threading.current_thread().name

    with ThreadPoolExecutor(1, thread_name_prefix="given") as given:
        assert compute.run(where, "a", thread=given) == ("a", given.submit(lambda: threading.current_thread().name)
                                                         .result())
    tag, name = compute.run(where, "b", name="own")
    assert tag == "b" and name.startswith("own") and name != threading.current_thread().name
