"""`streamrl fetch` downloading a model over HTTP, as the trainer pods' init container runs it:
the real huggingface_hub client against a small local server that answers the three calls a
snapshot download makes (the revision's commit, the file tree, each file). The download says
its bytes as they arrive, lands in HF_HUB_CACHE, and a second fetch finds it there."""

from __future__ import annotations

import hashlib
import json
import random
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import child_env

REPO = "streamrl-test/tiny"
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


class _FakeHub(ThreadingHTTPServer):
    """A model repository at one commit: GET /api/models/<repo>/revision/<rev>, GET
    /api/models/<repo>/tree/<commit>, HEAD and GET /<repo>/resolve/<commit>/<file>. Files are
    sent in `chunk` pieces `pause_s` apart, so a download lasts long enough to be watched."""

    def __init__(self, files: dict[str, bytes], chunk: int = 1 << 20, pause_s: float = 0.05):
        self.files, self.chunk, self.pause_s = files, chunk, pause_s
        self.downloads: list[str] = []
        super().__init__(("127.0.0.1", 0), _HubHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _HubHandler(BaseHTTPRequestHandler):
    server: _FakeHub

    def log_message(self, *args) -> None:
        pass

    def _json(self, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _file(self, send_body: bool) -> bool:
        m = re.fullmatch(rf"/{REPO}/resolve/[^/]+/(.+)", self.path.split("?")[0])
        if not m or m.group(1) not in self.server.files:
            return False
        data = self.server.files[m.group(1)]
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if send_body:
            self.server.downloads.append(m.group(1))
            for start in range(0, len(data), self.server.chunk):
                self.wfile.write(data[start:start + self.server.chunk])
                time.sleep(self.server.pause_s)
        return True

    def do_HEAD(self) -> None:
        if not self._file(send_body=False):
            self.send_error(404)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path.startswith(f"/api/models/{REPO}/revision/"):
            return self._json({"id": REPO, "sha": COMMIT,
                               "siblings": [{"rfilename": name} for name in self.server.files]})
        if path.startswith(f"/api/models/{REPO}/tree/"):
            return self._json([{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                               for name, data in self.server.files.items()])
        if not self._file(send_body=True):
            self.send_error(404)


@pytest.fixture
def hub(tiny_model_dir):
    files = {p.name: p.read_bytes() for p in sorted(tiny_model_dir.iterdir()) if p.is_file()}
    # bulk: huggingface_hub counts bytes in 10 MB reads, so 40 MB more make several of them
    files["notes.txt"] = random.Random(0).randbytes(40 << 20)
    server = _FakeHub(files, chunk=1 << 20, pause_s=0.03)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _fetch(job: Path, cache: Path, hub: _FakeHub) -> subprocess.CompletedProcess:
    env = dict(child_env(), HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run([sys.executable, "-m", "streamrl.cli", "fetch", str(job), "--progress-every", "0.1"],
                          env=env, capture_output=True, text=True, timeout=120)


def test_fetch_downloads_saying_its_bytes_then_finds_the_model_in_the_cache(hub, tiny_model_dir, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(f"apiVersion: streamrl.io/v1alpha1\nkind: RLJob\nmetadata: {{name: hub}}\n"
                   f"spec: {{model: {{source: hf, hf: {{repo: {REPO}}}}}}}\n")
    cache = tmp_path / "hub-cache"
    total = sum(len(d) for d in hub.files.values())
    done = _fetch(job, cache, hub)
    assert done.returncode == 0, done.stderr
    snapshot = Path(done.stdout.strip())
    assert snapshot == cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    for name, data in hub.files.items():
        assert (snapshot / name).read_bytes() == data
    lines = done.stderr.splitlines()
    assert f"model.hf {REPO}@main: fetching {total / 1e6:.1f} MB into the Hugging Face cache" in lines[0]
    said = [tuple(float(x) for x in m.groups()) for m in
            (re.match(rf"model\.hf {REPO}@main: ([\d.]+) MB of ([\d.]+) MB \((\d+)%\)", line) for line in lines) if m]
    assert len(said) >= 3, done.stderr  # the download took ~1.3 s, said every 0.1 s
    assert [s[0] for s in said] == sorted(s[0] for s in said)
    assert all(s[1] == round(total / 1e6, 1) for s in said)
    assert said[-1][0] == round(total / 1e6, 1) and said[-1][2] == 100 and lines[-1].endswith("; done")
    assert sorted(hub.downloads) == sorted(hub.files)

    again = _fetch(job, cache, hub)  # the init container of a restarted trainer pod
    assert again.returncode == 0, again.stderr
    assert Path(again.stdout.strip()) == snapshot
    assert f"model.hf {REPO}@main: in the Hugging Face cache" in again.stderr
    assert sorted(hub.downloads) == sorted(hub.files), "the cached files were downloaded again"
