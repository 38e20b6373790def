import subprocess
import sys

from tests.conftest import ROOT


def test_committed_stubs_match_a_fresh_generation(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts/gen_proto.py"), str(tmp_path)], check=True,
                   capture_output=True)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert fresh, "protoc wrote nothing"
    for rel in fresh:
        committed = ROOT / "streamrl" / rel.relative_to("streamrl")
        fresh = (tmp_path / rel).read_bytes()
        assert committed.read_bytes() == fresh, f"{committed} is stale: run scripts/gen_proto.py"


def test_every_proto_field_and_rpc_is_documented():
    import re

    lines = (ROOT / "proto/streamrl/v1/rollout.proto").read_text().splitlines()
    field = re.compile(r"^\s*(repeated\s+)?[\w.]+\s+\w+\s*=\s*\d+;|^\s*rpc\s")
    for i, line in enumerate(lines):
        if field.match(line):
            assert lines[i - 1].strip().startswith("//"), f"undocumented at line {i + 1}: {line.strip()}"
