"""An independent look at the process table, for tests of what a runner reports about its
children: which processes whose command line contains a needle ran, when the kernel
started each, and when each was last seen alive (a zombie no longer counts)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from streamrl.service import process_started_unix


class ProcessWatch:
    def __init__(self, needle: str, interval_s: float = 0.05):
        self.needle = needle
        self.interval_s = interval_s
        self.seen: dict[int, tuple[str, float, float]] = {}
        """pid -> (command line, started (Unix s), last seen alive (Unix s))."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="process-watch", daemon=True)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue  # gone meanwhile
                if self.needle not in cmdline:  # (a zombie's command line is empty)
                    continue
                pid = int(proc.name)
                started = self.seen[pid][1] if pid in self.seen else process_started_unix(pid)
                self.seen[pid] = (cmdline, started, now)
            self._stop.wait(self.interval_s)

    def lifetimes_s(self) -> dict[int, float]:
        return {pid: last - started for pid, (_, started, last) in self.seen.items()}
