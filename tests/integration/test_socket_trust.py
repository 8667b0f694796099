"""Who may serve the core's socket: a socket another local user bound (in a world-writable
directory, or at a default path while umad is down) gets no request from the gateway, the
client library or uma-cli; umad's default socket lives in a directory only its user can
write, created 0700, and the clients find it there."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from uma_serve.clients import UmaClient
from uma_serve.core.socket_path import UntrustedSocketError

from .gateway_helpers import start_gateway
from .helpers import VENV_BIN, Daemon

pytestmark = pytest.mark.integration
NOBODY = 65534
# a listener that records every byte it is sent, one connection after another
LISTENER = """
import socket, sys
path, log = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(64)
while True:
    conn, _ = s.accept()
    while data := conn.recv(65536):
        with open(log, "ab") as f:
            f.write(data)
    conn.close()
"""


@pytest.fixture
def squatter() -> Iterator[tuple[str, Path]]:
    """A socket bound by ``nobody`` in a world-writable directory, and its record."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run a listener as another user")
    where = Path(tempfile.mkdtemp(prefix="uma-shared-"))
    where.chmod(0o1777)
    (where / "listen.py").write_text(LISTENER)
    record = where / "got.bin"
    path = str(where / "uma.sock")
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         "/usr/bin/python3", str(where / "listen.py"), path, str(record)],
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < deadline, "the listener did not start"
        time.sleep(0.05)
    assert os.stat(path).st_uid == NOBODY
    yield path, record
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(where, ignore_errors=True)


def received(path: str, record: Path) -> bytes:
    """All the listener got: a last connection of ours is recorded after every earlier one."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(b"<end>")
    deadline = time.monotonic() + 30
    while not (record.exists() and record.read_bytes().endswith(b"<end>")):
        assert time.monotonic() < deadline, "the listener never recorded the last connection"
        time.sleep(0.05)
    return record.read_bytes()[: -len(b"<end>")]


def test_a_socket_served_by_another_user_gets_no_request(squatter, fresh_tmp):
    path, record = squatter
    with pytest.raises(UntrustedSocketError, match=f"served by uid {NOBODY}"):
        UmaClient(path)
    cli = subprocess.run(
        [str(VENV_BIN / "uma-cli"), "--socket", path, "--prompt", "SECRET-CLI"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 2 and f"served by uid {NOBODY}" in cli.stderr, cli.stderr
    gw = start_gateway(path, log_dir=fresh_tmp)
    try:
        r = httpx.post(f"{gw.base_url}/completions", json={"prompt": "SECRET-PROMPT"}, timeout=60)
        assert r.status_code == 503, r.text
        assert f"served by uid {NOBODY}" in r.json()["error"]["message"]
        assert httpx.get(f"{gw.url}/health").status_code == 503
        assert "Traceback" not in gw.log()
    finally:
        gw.stop()
    assert received(path, record) == b""


def test_the_default_socket_is_in_a_private_directory(fresh_tmp):
    runtime_dir = fresh_tmp / "xdg"
    runtime_dir.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir)}
    env.pop("UMA_SOCKET", None)
    log_path = fresh_tmp / "umad.log"
    proc = subprocess.Popen(
        [str(VENV_BIN / "umad"), "--n-ctx", "1024"],
        stdout=log_path.open("w"), stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    daemon = Daemon(str(runtime_dir / "uma" / "uma.sock"), proc, log_path)
    try:
        cli = [str(VENV_BIN / "uma-cli"), "--health"]
        deadline = time.monotonic() + 180
        while subprocess.run(cli, env=env, capture_output=True, timeout=60).returncode != 0:
            assert proc.poll() is None, daemon.log()
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.5)
        assert stat.S_IMODE(os.stat(runtime_dir / "uma").st_mode) == 0o700
        assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600
        out = subprocess.run(
            [str(VENV_BIN / "uma-cli"), "--prompt", "Hello", "--max-tokens", "2"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0 and out.stdout.strip(), out.stderr
    finally:
        assert daemon.stop() == 0
