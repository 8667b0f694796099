"""Every stream ends with ``data: [DONE]``, also when the core dies mid-stream or its drain
times out (an SDK or a proxy waiting for [DONE] otherwise hangs or reports a truncation)."""

from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest

from .gateway_helpers import start_gateway
from .helpers import start_daemon

pytestmark = pytest.mark.integration


def _stream_then(gw, act) -> list[str]:
    """A long stream's SSE data lines; ``act`` runs once its first token is out."""
    body = {"prompt": "Tell me a story.", "max_tokens": 400, "stream": True, "ignore_eos": True}
    lines: list[str] = []
    with httpx.stream("POST", f"{gw.base_url}/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[len("data: ") :])
                if len(lines) == 1:
                    threading.Thread(target=act).start()
    return lines


@pytest.mark.parametrize("how", ["sigkill", "drain-timeout"])
def test_a_stream_the_core_ends_early_still_ends_with_done(fresh_tmp, how) -> None:
    daemon = start_daemon(fresh_tmp, "--n-ctx", "1024", "--drain-timeout", "1")
    gw = start_gateway(daemon.socket)
    sig = signal.SIGKILL if how == "sigkill" else signal.SIGTERM
    try:
        lines = _stream_then(gw, lambda: daemon.proc.send_signal(sig))
    finally:
        gw.stop()
        daemon.stop(signal.SIGKILL)
    assert lines[-1] == "[DONE]", lines[-3:]
    error = json.loads(lines[-2])["error"]
    assert error["type"] == "server_error" and error["message"], error
    assert "Traceback" not in gw.log()
