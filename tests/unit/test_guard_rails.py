"""Guard rails the suite runs, not a reviewer's memory: the design card's layout, the import
contracts (import-linter, configured in pyproject.toml) and ruff."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

CARD = {  # the design card's components table (DESIGN.md): folder -> import name
    "proto/streamrl/v1": None,
    "services/generator": "streamrl.generator",
    "services/trainer": "streamrl.trainer",
    "services/ranker": "streamrl.ranker",
    "operator": "streamrl.operator",
    "helm/streamrl": None,
    "deploy/examples": None,
}
PACKAGE_DIR = {"operator": "operator/src"}
"""Where a component's package lies when not in its folder itself: a top-level operator/
package would shadow Python's own `operator` module for anything run from the checkout."""
SERVICES = [name for name in CARD.values() if name]


@pytest.mark.parametrize("folder, name", CARD.items())
def test_the_design_cards_folders_hold_their_components(folder, name):
    assert (ROOT / folder).is_dir(), f"{folder}/ is missing"
    if name is None:
        return
    package = ROOT / PACKAGE_DIR.get(folder, folder)
    assert (package / "__init__.py").is_file()
    # One package tree: streamrl/<service> links to the card's folder (relative, so a clone has it too).
    link = ROOT / "streamrl" / name.split(".")[1]
    assert link.is_symlink() and not Path(link.readlink()).is_absolute()
    assert link.resolve() == package.resolve()
    spec = importlib.util.find_spec(name)
    assert Path(spec.submodule_search_locations[0]).resolve() == package.resolve()


def _modules() -> set[Path]:
    """Every hand-written module once (the links under streamrl/ lead to the same files)."""
    found = {p.resolve() for folder in ("streamrl", "services", "operator") for p in (ROOT / folder).rglob("*.py")}
    return {p for p in found if "streamrl/v1/" not in p.as_posix()}


def test_every_module_has_a_docstring_a_noun_for_a_name_and_a_readable_size():
    problems = []
    for path in sorted(_modules()):
        rel = path.relative_to(ROOT)
        text = path.read_text()
        if path.stem in ("utils", "helpers", "manager", "misc", "common"):
            problems.append(f"{rel}: name a module by its noun")
        if path.stem != "__init__" and not ast.get_docstring(ast.parse(text)):
            problems.append(f"{rel}: no module docstring (its job, what it does not know)")
        if len(text.splitlines()) > 600:
            problems.append(f"{rel}: {len(text.splitlines())} lines (split it by noun)")
    assert not problems, "\n".join(problems)


def _class_definitions(package: Path) -> dict[str, list[str]]:
    """Class name -> where each class of that name is defined ("path:line", relative to the
    package's parent), over every module under `package`, its links followed (the services'
    folders are linked into streamrl/), generated stubs (v1/) left out."""
    where: dict[str, list[str]] = {}
    seen: set[Path] = set()
    for folder, dirs, files in os.walk(package, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not (folder == str(package) and d == "v1"))
        for name in sorted(f for f in files if f.endswith(".py")):
            path = Path(folder) / name
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    where.setdefault(node.name, []).append(f"{path.relative_to(package.parent)}:{node.lineno}")
    return where


def test_no_class_name_is_defined_twice():
    """One name per noun: a reader who meets `Fleet` or `Outcome` knows which one it is, and
    a search finds one definition (private classes too: a search does not know they are)."""
    twice = {name: files for name, files in _class_definitions(ROOT / "streamrl").items() if len(files) > 1}
    assert not twice, "class names defined more than once:\n" + "\n".join(
        f"  {name}: {', '.join(files)}" for name, files in sorted(twice.items()))


def test_a_class_name_defined_twice_is_named_with_both_files(tmp_path):
    """The check above can fail, and looks through the links into the services' folders."""
    (tmp_path / "services" / "svc").mkdir(parents=True)
    (tmp_path / "services" / "svc" / "worker.py").write_text("class Stop:\n    pass\n")
    (tmp_path / "pkg" / "v1").mkdir(parents=True)
    (tmp_path / "pkg" / "commands.py").write_text("import x\n\n\nclass Stop:\n    pass\n")
    (tmp_path / "pkg" / "v1" / "stub.py").write_text("class Stop:\n    pass\n")  # generated: not counted
    (tmp_path / "pkg" / "svc").symlink_to("../services/svc")
    assert _class_definitions(tmp_path / "pkg")["Stop"] == ["pkg/commands.py:4", "pkg/svc/worker.py:1"]


def test_import_contracts_hold():
    proc = subprocess.run([str(BIN / "lint-imports")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_import_contracts_catch_a_core_module_importing_a_service(tmp_path):
    """The contracts can fail: a copy of the tree where the records import the coordinator."""
    for folder in ("streamrl", "services", "operator"):
        shutil.copytree(ROOT / folder, tmp_path / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    records = tmp_path / "streamrl" / "records.py"
    records.write_text(records.read_text() + "\nimport streamrl.trainer.coordinator  # noqa\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": str(BIN)}
    proc = subprocess.run([str(BIN / "lint-imports")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert "streamrl.records -> streamrl.trainer.coordinator" in proc.stdout


def test_ruff_is_clean():
    proc = subprocess.run([str(BIN / "ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_the_checkout_shadows_no_standard_module():
    """`python -m ...` from the repository root puts it first on sys.path: no top-level folder
    there may be a package named like a standard module (operator/ holds its package in src/)."""
    proc = subprocess.run([sys.executable, "-S", "-c", "import operator, sys; print(operator.__file__)"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).parent == Path(shutil.__file__).parent
    stdlib = set(sys.stdlib_module_names)
    assert not [d.name for d in ROOT.iterdir() if (d / "__init__.py").exists() and d.name in stdlib]


def test_test_modules_have_unique_basenames():
    """pytest imports test modules by basename (rootdir-relative, no __init__ packages): two
    test_x.py in different folders stop collection on a clean clone with 'import file mismatch'
    (a warm checkout's __pycache__ hides it)."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
