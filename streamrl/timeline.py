"""One process's activity as spans in `timeline/<name>.jsonl`, for the run report's Gantt chart:
each span is written as it closes (one line-buffered append, no fsync) and the open one is
written up to now every HEARTBEAT_S, so a process killed without warning still shows up to
within HEARTBEAT_S of its death. Knows nothing of what the states mean.

A line: {"state": "busy"|"idle", "reason": str, "start": unix s, "end": unix s}. A heartbeat
splits a long span in two; `read_spans` joins such pieces back.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

HEARTBEAT_S = 1.0
"""How often the open span is written up to now (the most a SIGKILL can take off a row)."""
JOIN_GAP_S = 1e-3
"""Pieces of one span (same state, one ending where the next starts) are joined when reading."""

State = tuple[str, str]
"""(state, reason): ("busy", "") or ("idle", "waiting_samples")..."""


class Timeline:
    """The writer: `enter(state)` closes the open span and opens the next; a daemon thread
    writes the open span up to now every `heartbeat_s`; `close()` writes the last one.
    Thread-safe. A file another process left with a torn last line is continued on a new line."""

    def __init__(self, path: Path, heartbeat_s: float = HEARTBEAT_S):
        if heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s: must be > 0, got {heartbeat_s}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.heartbeat_s = heartbeat_s
        self._lock = threading.Lock()
        self._file = open(path, "a", buffering=1)  # line-buffered: each span is one write(2)
        if self._file.tell() > 0 and not _ends_with_newline(path):
            self._file.write("\n")  # an earlier process of this name was killed mid-line
        self._open: tuple[State, float] | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"timeline-{path.stem}", daemon=True)
        self._thread.start()

    def enter(self, state: State, at: float | None = None) -> None:
        """Close the open span (if any) at `at` (unix s; now) and open one in `state` there."""
        with self._lock:
            if self._file.closed:
                return
            at = time.time() if at is None else at
            if self._open is not None:
                self._write(*self._open, at)
            self._open = (state, at)

    def heartbeat(self, now: float | None = None) -> None:
        """Write the open span up to `now`; it carries on from there as a new piece."""
        with self._lock:
            if self._file.closed or self._open is None:
                return
            now = time.time() if now is None else now
            state, start = self._open
            if now > start:
                self._write(state, start, now)
                self._open = (state, now)

    def close(self, at: float | None = None) -> None:
        """Write the open span up to `at` (now) and close the file; later calls do nothing."""
        with self._lock:
            if self._file.closed:
                return
            if self._open is not None:
                self._write(*self._open, time.time() if at is None else at)
                self._open = None
            self._file.close()
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.heartbeat_s)

    def _beat(self) -> None:
        while not self._stopped.wait(self.heartbeat_s):
            self.heartbeat()

    def _write(self, state: State, start: float, end: float) -> None:
        self._file.write(json.dumps({"state": state[0], "reason": state[1], "start": round(start, 4),
                                     "end": round(end, 4)}) + "\n")


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def read_spans(path: Path) -> list[dict]:
    """A timeline file's spans in order, heartbeat pieces joined; a line a killed process
    left torn is skipped."""
    spans: list[dict] = []
    for line in Path(path).read_text().splitlines():
        try:
            s = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(s, dict) or not {"state", "reason", "start", "end"} <= s.keys():
            continue
        last = spans[-1] if spans else None
        if (last is not None and (last["state"], last["reason"]) == (s["state"], s["reason"])
                and abs(s["start"] - last["end"]) <= JOIN_GAP_S):
            last["end"] = max(last["end"], s["end"])
        else:
            spans.append({"state": s["state"], "reason": s["reason"], "start": s["start"], "end": s["end"]})
    return spans
