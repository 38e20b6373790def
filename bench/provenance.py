"""Where a bench's figures come from: each invocation's fresh directory (so `streamrl run` never
resumes a finished run and reprints it) and the provenance its last JSON line carries (commit,
machine, start time, the run directories measured). Knows nothing of what a bench measures."""

from __future__ import annotations

import json
import os
import platform
import secrets
import subprocess
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_HELP = ("parent folder: every invocation writes into a new directory beneath it, <out>/<UTC time>-<random>/, "
            "so no run directory is ever reused (or resumed); an --out holding earlier runs is fine")


@dataclass(frozen=True)
class Machine:
    """The machine the figures were measured on."""

    cores: int
    """os.cpu_count(): the cores the machine has online."""
    cores_available: int
    """len(os.sched_getaffinity(0)): the cores the bench's process may run on (its affinity)."""
    cpu_model: str | None
    """/proc/cpuinfo's first "model name", else platform.processor(); None when neither says."""

    @classmethod
    def this(cls) -> Machine:
        cores = os.cpu_count() or 1
        available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
        return cls(cores=cores, cores_available=available, cpu_model=cpu_model())


@dataclass(frozen=True)
class Provenance:
    """The `provenance` object of a bench's last JSON line."""

    git_commit: str | None
    """The checkout's HEAD, 40 hex digits; None outside a git checkout."""
    git_dirty: bool
    """Whether the working tree differed from that commit (changed or untracked, not ignored, files)."""
    machine: Machine
    started_at: str
    """When the invocation started: UTC, ISO 8601 (2026-12-04T10:15:02+00:00)."""
    run_dirs: tuple[str, ...]
    """Every run directory measured, absolute, in the order they were started; empty for a bench
    that measures in-process (bench/weights.py)."""

    def to_json(self) -> dict:
        return {**asdict(self), "run_dirs": list(self.run_dirs)}

    @classmethod
    def from_json(cls, data: dict) -> Provenance:
        return cls(**{**data, "machine": Machine(**data["machine"]), "run_dirs": tuple(data["run_dirs"])})

    @classmethod
    def of_report(cls, line: str) -> Provenance:
        """The provenance of a bench's last JSON line."""
        return cls.from_json(json.loads(line)["provenance"])

    def run_dir(self, name: str) -> Path:
        """The one measured run directory called `name` (a bench's run directories have distinct names)."""
        found = [Path(d) for d in self.run_dirs if Path(d).name == name]
        if len(found) != 1:
            raise ValueError(f"{len(found)} run directories named {name!r} in {list(self.run_dirs)}")
        return found[0]


class Invocation:
    """One invocation of a bench: a directory of its own, new under --out, the run directories it
    measures there (and in benches it ran), and its provenance."""

    def __init__(self, out: str | Path):
        self.started = datetime.now(UTC)
        # exist_ok=False: a directory that exists already is never reused; the random part keeps
        # two invocations in the same second apart.
        self.dir = (Path(out) / f"{self.started:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}").resolve()
        self.dir.mkdir(parents=True, exist_ok=False)
        self._run_dirs: list[Path] = []
        print(f"writing into {self.dir}", file=sys.stderr, flush=True)

    def run_dir(self, name: str) -> Path:
        """A run directory `name` in this invocation's directory (not created), recorded as measured."""
        path = self.dir / name
        assert path not in self._run_dirs and not path.exists(), f"{path} is used twice"
        self._run_dirs.append(path)
        return path

    def measured(self, provenance: Provenance) -> None:
        """Count the run directories of a bench this one ran as measured here too."""
        self._run_dirs.extend(Path(d) for d in provenance.run_dirs)

    def provenance(self) -> Provenance:
        return Provenance(git_commit=git_commit(), git_dirty=git_dirty(), machine=Machine.this(),
                          started_at=self.started.isoformat(timespec="seconds"),
                          run_dirs=tuple(str(d) for d in self._run_dirs))

    def report(self, result: dict) -> str:
        """`result` and the provenance, as one JSON object: the bench's last line."""
        assert "provenance" not in result
        return json.dumps({**result, "provenance": self.provenance().to_json()})


def _git(root: Path, *args: str) -> str | None:
    """git's stdout, or None where git is missing or `root` is in no checkout."""
    try:  # --no-optional-locks: reading the state must not rewrite the index
        proc = subprocess.run(["git", "--no-optional-locks", *args], cwd=root, capture_output=True, text=True,
                              timeout=60)
    except FileNotFoundError:
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_commit(root: Path = ROOT) -> str | None:
    out = _git(root, "rev-parse", "--verify", "HEAD")
    return out.strip() if out else None


def git_dirty(root: Path = ROOT) -> bool:
    return bool(_git(root, "status", "--porcelain"))


def cpu_model() -> str | None:
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return platform.processor() or None
