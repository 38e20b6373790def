"""Shared fixtures: a tiny untrained model on disk and RLJob files written from dicts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy/examples/rljob-tiny-cpu.yaml"

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from streamrl.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=1)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


@pytest.fixture
def write_job(tmp_path):
    """write_job(overrides) -> path of the example RLJob with `overrides` merged in."""

    def write(overrides: dict, name: str = "job.yaml") -> Path:
        job = _merge(yaml.safe_load(EXAMPLE.read_text()), overrides)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(job))
        return path

    return write


def child_env() -> dict:
    """Environment for service subprocesses started by tests: one thread each."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
