"""The Hugging Face Hub through huggingface_hub: a model repository's snapshot, or one file of
a dataset repository, downloaded once into its cache (HF_HUB_CACHE) and found there
afterwards, offline too (HF_HUB_OFFLINE=1). The token is huggingface_hub's to find (HF_TOKEN,
HF_TOKEN_PATH: a mounted Secret's file, or what `hf auth login` stored). Errors name the
spec's field. A model download says its bytes as they arrive (DownloadProgress): in Kubernetes
the operator shows the fetch container's last such line in the job's status."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from streamrl.spec.training import HfFileSource, HfModelSource

MODEL_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
"""What a model download takes: configs, safetensors weights and tokenizer files (not the
.bin/.pt/.h5/.msgpack/.onnx copies many repositories also hold)."""


@contextmanager
def _named(field: str, repo: str, revision: str) -> Iterator[None]:
    """huggingface_hub's errors as ValueErrors naming `field` (model.hf, task.hf)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except GatedRepoError as err:
        raise ValueError(f"{field}.repo {repo}: gated; its terms must be accepted and a token given "
                         f"({field}.tokenSecret in Kubernetes, HF_TOKEN here): {err}") from err
    except RevisionNotFoundError as err:
        raise ValueError(f"{field}.revision {revision!r}: {repo} has no such branch, tag or commit") from err
    except RepositoryNotFoundError as err:
        raise ValueError(f"{field}.repo {repo}: no such repository (or it is private and no token was given)") \
            from err
    except LocalEntryNotFoundError as err:
        raise ValueError(f"{field} {repo}@{revision}: not in the Hugging Face cache and the hub cannot be reached "
                         f"(offline: HF_HUB_OFFLINE, or no network): {err}") from err
    except EntryNotFoundError as err:
        raise ValueError(f"{field}.file: {repo}@{revision} holds no such file: {err}") from err


PROGRESS_EVERY_S = 10.0
"""How often a download says how far it got."""


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


class DownloadProgress:
    """The bytes of one download as they arrive, said at most every `every_s` seconds and once
    at the end: "<what>: 1.2 GB of 14.8 GB (8%), 45.0 MB/s, about 5 min left". Bytes arrive on
    huggingface_hub's download threads."""

    def __init__(self, what: str, total: int | None, log: Callable[[str], None], every_s: float = PROGRESS_EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.what, self.total, self.log, self.every_s, self.clock = what, total, log, every_s, clock
        self.done = 0
        self._start = self._said = clock()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = self.clock()
            if now - self._said >= self.every_s and not (self.total and self.done >= self.total):
                self._said = now
                self.log(self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = max((self.clock() if now is None else now) - self._start, 1e-9)
        rate = self.done / elapsed
        said = f"{self.what}: {_size(self.done)}"
        if self.total:
            said += f" of {_size(self.total)} ({100 * self.done / self.total:.0f}%)"
        said += f", {_size(rate)}/s"
        if self.total and rate > 0 and self.done < self.total:
            left = (self.total - self.done) / rate
            said += f", about {left:.0f} s left" if left < 90 else f", about {left / 60:.0f} min left"
        return said

    def tqdm_class(self) -> type:
        """A huggingface_hub progress bar class (snapshot_download's `tqdm_class`) that feeds
        this object the bytes written to the cache (the bar named huggingface_hub.snapshot_download;
        the file-count and network-transfer bars are left alone)."""
        from huggingface_hub.utils import tqdm as hf_tqdm

        progress = self

        class _Bytes(hf_tqdm):
            def __init__(self, *args, **kwargs):
                self._counts = kwargs.get("name") == "huggingface_hub.snapshot_download"
                super().__init__(*args, **kwargs)
                if self._counts and kwargs.get("initial"):
                    progress.add(int(kwargs["initial"]))

            def update(self, n=1):
                if self._counts and n:
                    progress.add(int(n))
                return super().update(n)

        return _Bytes


def _to_download(source: HfModelSource) -> int | None:
    """Bytes of the model's files not in the cache yet (None: the hub cannot say)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        files = snapshot_download(source.repo, revision=source.revision, allow_patterns=MODEL_PATTERNS,
                                  dry_run=True)
    except (HfHubHTTPError, OSError, ValueError):
        return None  # the download itself says why, naming the field
    return sum(f.file_size or 0 for f in files if f.will_download)


def download_model(source: HfModelSource, log: Callable[[str], None] = print,
                   every_s: float = PROGRESS_EVERY_S) -> Path:
    """The snapshot directory of an `hf` model (model.hf), its download's progress said every
    `every_s` seconds."""
    from huggingface_hub import constants, snapshot_download

    total = None if constants.HF_HUB_OFFLINE else _to_download(source)
    what = f"model.hf {source.repo}@{source.revision}"
    if total == 0:
        log(f"{what}: in the Hugging Face cache")
    else:
        log(f"{what}: fetching {_size(total) + ' ' if total else ''}into the Hugging Face cache (once; later starts "
            "find it there)")
    progress = DownloadProgress(what, total, log, every_s)
    with _named("model.hf", source.repo, source.revision):
        path = Path(snapshot_download(source.repo, revision=source.revision, allow_patterns=MODEL_PATTERNS,
                                      tqdm_class=progress.tqdm_class()))
    if progress.done:
        log(progress.line() + "; done")
    return path


def download_file(source: HfFileSource, log: Callable[[str], None] = print) -> Path:
    """The local path of one file of a dataset repository (task.hf)."""
    from huggingface_hub import hf_hub_download

    log(f"task.hf {source.repo}@{source.revision}: fetching {source.file} into the Hugging Face cache")
    with _named("task.hf", source.repo, source.revision):
        return Path(hf_hub_download(source.repo, source.file, repo_type="dataset", revision=source.revision))
