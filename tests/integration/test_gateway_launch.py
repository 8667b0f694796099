"""`make run`'s launcher: core then gateway, both stopped by one Ctrl-C."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from .gateway_helpers import free_port

pytestmark = pytest.mark.integration


def test_launch_starts_both_and_ctrl_c_stops_both(fresh_tmp):
    sock, port = str(fresh_tmp / "uma.sock"), free_port()
    log = (fresh_tmp / "launch.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uma_serve.launch", "--socket", sock, "--port", str(port),
         "--", "--n-seq", "2", "--n-ctx", "1024"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (fresh_tmp / "launch.log").read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "core + gateway did not come up"
            time.sleep(0.2)
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(40) == 0
        log.close()
        # a Ctrl-C is how this is stopped: no traceback (uvicorn raises its KeyboardInterrupt)
        assert "Traceback" not in (fresh_tmp / "launch.log").read_text()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with pytest.raises(OSError):
            probe.connect(sock)
        probe.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
