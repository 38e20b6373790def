"""What a generator killed while loading a version leaves in memory-backed storage is removed by
the next engine on it; what a live generator is loading stays."""

from __future__ import annotations

import os
import subprocess
import sys

from streamrl.generator.vllm_engine import VERSIONS_PREFIX, remove_orphaned_versions


def _version_dir(base, pid: int, version: int):
    path = base / f"{VERSIONS_PREFIX}{pid}-v{version}-abc123" / f"v{version}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"\0" * 64)
    return path.parent


def test_versions_of_dead_processes_and_of_an_earlier_process_under_this_id_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        orphan = _version_dir(tmp_path, dead.pid, 3)
        same_id = _version_dir(tmp_path, os.getpid(), 4)  # a restarted container's process id
        loading = _version_dir(tmp_path, live.pid, 5)
        unrelated = tmp_path / "streamrl-vllm-notapid-v1"
        unrelated.mkdir()
        other = tmp_path / "other-cache"
        other.mkdir()

        removed = remove_orphaned_versions(tmp_path)

        assert sorted(removed) == sorted([orphan, same_id])
        assert not orphan.exists() and not same_id.exists()
        assert loading.exists() and unrelated.exists() and other.exists()
    finally:
        live.kill()
        live.wait()
