"""The real Prometheus behind a wrapper that points its configuration at a targets file that
is not there (what a relative path once did): it runs and answers, and discovers nothing.
For the tests of a run's scrape check."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path


def blind_prometheus_dir(tmp_path: Path) -> Path:
    """A folder holding such a `prometheus`; put it first on PATH."""
    real = shutil.which("prometheus")
    assert real, "these tests need Debian's prometheus package"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "prometheus"
    wrapper.write_text(f"""#!/bin/sh
for arg in "$@"; do
  case "$arg" in --config.file=*) sed -i 's#- /.*/targets.json#- missing/targets.json#' "${{arg#--config.file=}}";;
  esac
done
exec {real} "$@"
""")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return bin_dir
