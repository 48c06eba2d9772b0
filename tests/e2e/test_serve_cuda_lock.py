"""The serve-cuda lock resolves without a GPU and without downloading its wheels.

scripts/lock.sh makes scripts/locks/serve-cuda.txt with uv and nothing ever installs it here. This test asks a
second resolver, pip's, to install vllm==0.32.0 with that lock as constraints for Python 3.11 on linux x86_64
(`--dry-run --report`), against PyPI, and checks that it picks exactly the lock's pins. The registry serves no
PEP 658 metadata files for these wheels, so pip reads each wheel's METADATA through HTTP range requests
(`--use-feature=fast-deps`) instead of downloading it: the CUDA torch and vLLM wheels alone are over 1 GB.
A counting proxy between pip and the registry measures what crossed the network.

Measured 2026-11-26 on a shared 2-core machine: 23-33 s, 69 MB of index pages from the registry's index and
11 MB of wheel fragments from its file host.

One wheel needs glibc 2.31: llguidance 1.7.6 ships no manylinux_2_28 wheel for x86_64 (only manylinux_2_31),
so the platforms offered below go up to manylinux_2_31 (Ubuntu 20.04); on an older glibc pip would build it
from source (Rust).
"""

from __future__ import annotations

import json
import select
import socket
import socketserver
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.conftest import REPO
from tests.waits import run_waiting

#: long (BATON_TEST_LONG=1): nothing here changes the lock but scripts/lock.sh serve-cuda, after which it runs
pytestmark = [pytest.mark.e2e, pytest.mark.long]

LOCK = REPO / "scripts" / "locks" / "serve-cuda.txt"
#: every manylinux tag a glibc 2.31 x86_64 machine accepts (pip does not widen --platform by itself)
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(31, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
#: the wheel host may send at most this much (bytes): a tenth of vLLM's own 326 MB wheel
WHEEL_HOST_BYTES_MAX = 32 * 2**20
#: pip resolving 198 packages over range requests (23 s measured); bounds a hung registry only
RESOLVE_S = 600.0


class _Tunnel(socketserver.BaseRequestHandler):
    """One CONNECT tunnel: relay bytes both ways, count what the remote host sends."""

    server: _CountingProxy

    def handle(self) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            head += chunk
        method, target = head.split(b" ", 2)[:2]
        if method != b"CONNECT":
            self.request.sendall(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            return
        host, port = target.decode().rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=60) as upstream:
            self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self._relay(upstream, host)

    def _relay(self, upstream: socket.socket, host: str) -> None:
        ends = [self.request, upstream]
        while True:
            readable, _, _ = select.select(ends, [], [], 120)
            if not readable:
                return
            for end in readable:
                data = end.recv(65536)
                if not data:
                    return
                (upstream if end is self.request else self.request).sendall(data)
                if end is upstream:
                    self.server.count(host, len(data))


class _CountingProxy(socketserver.ThreadingTCPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Tunnel)
        self.received: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, host: str, n: int) -> None:
        with self._lock:
            self.received[host] += n


@pytest.fixture
def proxy() -> Iterator[_CountingProxy]:
    server = _CountingProxy()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _pins(lock: Path) -> dict[str, str]:
    """name -> version of a pip-freeze style lock, names normalised (PEP 503)."""
    pins = {}
    for line in lock.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[_normal(name)] = version
    return pins


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def test_pip_resolves_the_serve_cuda_lock_from_metadata_only(proxy: _CountingProxy, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    cmd = [
        sys.executable, "-m", "pip", "install", "vllm==0.32.0", "-c", str(LOCK),
        "--isolated", "--no-cache-dir",  # pip's own default index: this machine's configuration is ignored
        "--proxy", f"http://127.0.0.1:{proxy.server_address[1]}",
        "--dry-run", "--ignore-installed", "--report", str(report), "--use-feature=fast-deps",
        "--only-binary=:all:", "--python-version", "3.11", *platforms,
    ]  # fmt: skip
    out = run_waiting(cmd, waiting_for="pip resolving the serve-cuda lock", timeout=RESOLVE_S)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    installs = json.loads(report.read_text())["install"]
    chosen = {_normal(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}
    pins = _pins(LOCK)
    del pins["pip"]  # the lock pins the environment's pip too; vLLM does not require it
    assert chosen == pins
    sent = dict(proxy.received)
    print(f"bytes received through the proxy: {sent}")
    wheel_host = urlparse(installs[0]["download_info"]["url"]).hostname  # where the chosen wheels live
    assert 0 < sent.get(wheel_host, 0) < WHEEL_HOST_BYTES_MAX, sent
