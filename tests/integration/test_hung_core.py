"""A hung core (umad stopped with SIGSTOP: it accepts connections, answers nothing) costs a
request at most the first-event deadline, and once the liveness check has seen it, nothing:
503 at once, naming the core (not its socket path). It serves again once it answers."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from .gateway_helpers import start_gateway
from .helpers import start_daemon

pytestmark = pytest.mark.integration


def _completion(gw, stream: bool) -> httpx.Response:
    body = {"prompt": "Hello", "max_tokens": 4, "stream": stream}
    return httpx.post(f"{gw.base_url}/completions", json=body, timeout=120)


def _until(check, what: str, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (result := check()) is not None:
            return result
        time.sleep(0.2)
    raise AssertionError(f"never: {what}")


def test_a_stopped_core_gets_503_naming_it_and_serves_again(fresh_tmp) -> None:
    daemon = start_daemon(fresh_tmp, "--n-ctx", "1024")
    flags = ("--health-interval", "0.5", "--liveness-timeout", "2", "--first-event-timeout", "5")
    gw = start_gateway(daemon.socket, *flags)
    try:
        assert _completion(gw, stream=True).status_code == 200
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        try:
            first = _completion(gw, stream=True)  # before or after the check has seen it
            assert first.status_code == 503, first.text
            assert first.json()["error"]["code"] in ("core_unavailable", "core_timeout")

            def refused_naming_the_core() -> dict | None:
                r = _completion(gw, stream=False)
                assert r.status_code == 503, r.text
                err = r.json()["error"]
                return err if "core 0 is not answering" in err["message"] else None

            err = _until(refused_naming_the_core, "a 503 from the liveness check")
            assert err["code"] == "core_unavailable" and daemon.socket not in err["message"]
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
        _until(lambda: _completion(gw, stream=True).status_code == 200 or None, "served again")
        assert "Traceback" not in gw.log() and "Traceback" not in daemon.log()
    finally:
        gw.stop()
        daemon.stop()
