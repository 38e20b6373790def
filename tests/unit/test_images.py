"""The container images, checked without a Docker daemon: each Dockerfile installs exactly
as docs/kubernetes.md ("Container images") says, is multi-stage and non-root, and its entry point is a real console
script whose every role answers --help."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"docker/Dockerfile": "(CPU)", "docker/Dockerfile.cuda": "(GPU)"}


def _readme_install(marker: str) -> str:
    for line in (ROOT / "docs" / "kubernetes.md").read_text().splitlines():
        if line.startswith("| `ghcr.io") and marker in line:
            return re.findall(r"`([^`]*pip install[^`]*)`", line)[0]
    raise AssertionError(f"docs/kubernetes.md's Container images table has no {marker} row")


def _pip_lines(dockerfile: str) -> list[str]:
    text = (ROOT / dockerfile).read_text().replace("\\\n", " ")
    return [" ".join(m.split()) for m in re.findall(r"^RUN (pip install[^\n]*)", text, flags=re.M)]


@pytest.mark.parametrize("dockerfile, marker", DOCKERFILES.items())
def test_dockerfile_installs_as_the_docs_say(dockerfile, marker):
    assert _pip_lines(dockerfile) == [" ".join(_readme_install(marker).split())]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_is_multi_stage_non_root_with_the_streamrl_entry_point(dockerfile):
    text = (ROOT / dockerfile).read_text()
    assert len(re.findall(r"^FROM ", text, flags=re.M)) >= 2
    assert re.search(r"^USER 10001$", text, flags=re.M)
    assert 'ENTRYPOINT ["streamrl"]' in text
    for src in re.findall(r"^COPY (?!--from)(\S+)", text, flags=re.M):
        assert (ROOT / src).exists() or (ROOT / "docker" / Path(src).name).exists(), src
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["streamrl"] == "streamrl.cli:main"


def test_extras_the_images_install_exist():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"operator", "vllm"} <= extras.keys()
    assert any(d.startswith("vllm==") for d in extras["vllm"])


@pytest.mark.parametrize("role", ["", "run", "validate", "trainer", "generator", "ranker", "report", "operator"])
def test_every_role_answers_help(role):
    out = subprocess.run([sys.executable, "-m", "streamrl.cli", *([role] if role else []), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "usage: streamrl" in out.stdout


def _instructions(dockerfile: str, *names: str) -> list[str]:
    """The Dockerfile's instructions of those kinds (ENV, ARG...), continuation lines joined, comments dropped."""
    lines = [ln for ln in (ROOT / dockerfile).read_text().splitlines() if not ln.lstrip().startswith("#")]
    text = "\n".join(lines).replace("\\\n", " ")
    return [ln for ln in text.splitlines() if ln.split(maxsplit=1)[:1] and ln.split()[0].upper() in names]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_no_image_makes_every_gpu_of_its_node_visible(dockerfile):
    # The device plugin sets NVIDIA_VISIBLE_DEVICES for a container that requests GPUs. Baked into
    # the image, a CPU-only role (the ranker, a pool with gpus: 0) would see every GPU of its node
    # wherever NVIDIA's runtime is the default (review S2-6).
    settings = _instructions(dockerfile, "ENV", "ARG")
    assert settings, f"{dockerfile} sets no ENV at all: the parser missed them"
    assert not [s for s in settings if "NVIDIA_VISIBLE_DEVICES" in s]
