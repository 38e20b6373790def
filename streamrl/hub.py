"""The Hugging Face Hub through huggingface_hub: a model repository's snapshot, or one file of
a dataset repository, downloaded once into its cache (HF_HUB_CACHE) and found there
afterwards, offline too (HF_HUB_OFFLINE=1). The token is huggingface_hub's to find (HF_TOKEN,
HF_TOKEN_PATH: a mounted Secret's file, or what `hf auth login` stored). Errors name the
spec's field."""

from __future__ import annotations

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


def download_model(source: HfModelSource, log: Callable[[str], None] = print) -> Path:
    """The snapshot directory of an `hf` model (model.hf)."""
    from huggingface_hub import snapshot_download

    log(f"model.hf {source.repo}@{source.revision}: fetching into the Hugging Face cache (once; later starts "
        "find it there)")
    with _named("model.hf", source.repo, source.revision):
        return Path(snapshot_download(source.repo, revision=source.revision, allow_patterns=MODEL_PATTERNS))


def download_file(source: HfFileSource, log: Callable[[str], None] = print) -> Path:
    """The local path of one file of a dataset repository (task.hf)."""
    from huggingface_hub import hf_hub_download

    log(f"task.hf {source.repo}@{source.revision}: fetching {source.file} into the Hugging Face cache")
    with _named("task.hf", source.repo, source.revision):
        return Path(hf_hub_download(source.repo, source.file, repo_type="dataset", revision=source.revision))
