"""A model directory laid out in a Hugging Face hub cache as huggingface_hub writes one
(models--<org>--<name>/blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>,
refs/<revision> holding the commit), so the real resolution code finds it offline."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def cache_model(model_dir: Path, cache: Path, repo: str, revisions: tuple[str, ...] = ("main",),
                commit: str = "0123456789abcdef0123456789abcdef01234567", kind: str = "model") -> Path:
    """Put model_dir's files into `cache` as repository `repo` (of `kind` model or dataset) at
    `commit`, named by every one of `revisions`; returns the snapshot directory."""
    root = cache / (f"{kind}s--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in sorted(p for p in Path(model_dir).iterdir() if p.is_file()):
        blob = root / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        link = snapshot / f.name
        link.unlink(missing_ok=True)
        os.symlink(os.path.relpath(blob, snapshot), link)
    (root / "refs").mkdir(exist_ok=True)
    for revision in revisions:
        (root / "refs" / revision).write_text(commit)
    return snapshot
