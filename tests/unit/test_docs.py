"""The front door and the manual: the README stays a front door (at most 250 lines), every
relative link in it and in the other Markdown pages resolves (file and heading), the docs
build as a site with `mkdocs build --strict`, and the generated pages (the RLJob reference,
the code map, the architecture diagram) match their sources."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "bench" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _slug(heading: str) -> str:
    """A heading's anchor as MkDocs and GitHub make it (lower case, punctuation dropped)."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    in_code, out = False, set()
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(_slug(line.lstrip("#")))
    return out


def _prose(page: Path) -> str:
    """The page without code: fenced blocks and inline code spans hold no links."""
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
    return re.sub(r"`[^`\n]*`", "", text)


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail to docs/"
    text = "\n".join(lines)
    for must in ("make run", "make test", "docs/architecture.svg", "## Results", "kubectl apply"):
        assert must in text, must


def test_the_docs_table_is_in_docs_index_alone():
    rows = [line for page in PAGES if page.exists() for line in page.read_text().splitlines()
            if line.startswith("| Getting started |")]
    assert len(rows) == 1 and "[the code map](code-map.md)" in rows[0], rows


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_no_page_repeats_its_title_as_a_section(page):
    """A page cut from a README section keeps no second heading of its own name (a heading's name:
    before any colon or parenthesis)."""
    names = [re.split(r"[:(]", h)[0].strip().lower() for h in re.findall(r"^#{1,2} (.+)$", _prose(page), re.M)]
    assert names[0] not in names[1:]


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows of the first table under `heading`, each as its cells."""
    part = text.split(f"\n{heading}\n", 1)[1]
    rows = [line for line in part.split("\n\n#", 1)[0].splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def test_the_readmes_results_are_the_benchmarks_current_figures():
    current = {(row[0], row[-1]) for row in _table((ROOT / "docs" / "benchmarks.md").read_text(), "## Current figures")}
    results = _table((ROOT / "README.md").read_text(), "## Results")
    assert results and {(row[2].removeprefix("`bench/").removesuffix("`"), row[-1]) for row in results} <= \
        {(bench.strip("`"), commit) for bench, commit in current}
    assert not [row for row in results if re.search(r"\brun [A-Z]\b", row[1])], "no run letters in the README"


@pytest.mark.parametrize("page", [p for p in PAGES if p.exists()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert broken == [], broken


def test_the_docs_build_as_a_site_in_strict_mode(tmp_path):
    mkdocs = Path(sys.executable).parent / "mkdocs"
    out = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "spec" / "index.html").is_file()
    assert (tmp_path / "site" / "architecture.svg").is_file()


def test_the_rljob_reference_is_generated_from_the_spec():
    assert (ROOT / "docs" / "spec.md").read_text() == _script("gen_reference").render(), \
        "stale docs/spec.md: run python scripts/gen_reference.py"


def test_the_calibration_page_is_generated_from_the_catalog():
    assert (ROOT / "docs" / "calibration.md").read_text() == _script("gen_calibration").render(), \
        "stale docs/calibration.md: run python scripts/gen_calibration.py"


def test_the_code_map_is_generated_from_the_docstrings():
    assert (ROOT / "docs" / "code-map.md").read_text() == _script("gen_code_map").render(), \
        "stale docs/code-map.md: run python scripts/gen_code_map.py"


def test_the_code_map_lists_every_module_once_under_its_real_folder():
    text = (ROOT / "docs" / "code-map.md").read_text()
    folders = re.findall(r"^## `([^`]+)`", text, re.M)
    assert len(folders) == len(set(folders))
    assert {"streamrl/", "streamrl/rollout/", "services/trainer/", "services/generator/", "services/ranker/",
            "operator/src/"} <= set(folders)
    assert not {"streamrl/trainer/", "streamrl/generator/", "streamrl/ranker/", "streamrl/operator/"} & set(folders)
    modules = {Path(d, f).resolve() for d, _, files in os.walk(ROOT / "streamrl", followlinks=True)
               for f in files if f.endswith(".py")}
    assert len(re.findall(r"^- `[^`]+\.py`", text, re.M)) == len(modules)
    assert "- `loop.py`: " in text.split("## `services/trainer/`")[1].split("\n## ")[0]


def test_every_spec_field_is_in_the_reference():
    text = (ROOT / "docs" / "spec.md").read_text()
    for section, field in [("spec.generators.pools[]", "clusterRef"), ("spec.trainer", "processesPerNode"),
                           ("spec.security.tls", "generatorServerName"), ("spec.pipeline", "maxStaleness")]:
        part = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
        assert f"| `{field}` |" in part, (section, field)


def test_the_architecture_diagram_is_drawn_from_its_source():
    """The committed SVG holds every label the script draws (text stays text in it)."""
    import matplotlib

    matplotlib.use("Agg")
    figure = _script("gen_diagram").draw()
    labels = {t.get_text() for t in figure.findobj(matplotlib.text.Text) if t.get_text().strip()}
    svg = html.unescape((ROOT / "docs" / "architecture.svg").read_text())
    missing = [label for label in labels if all(part not in svg for part in label.splitlines())]
    assert len(labels) > 20
    assert missing == [], f"stale docs/architecture.svg: run python scripts/gen_diagram.py ({missing})"
