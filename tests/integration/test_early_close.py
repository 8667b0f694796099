"""An answer given before the request body was read closes the connection (issue 35): a body
that came late once kept such a connection open for good (uvicorn's keep-alive timer was
cancelled by it and never re-armed), and a thousand of them used up the gateway's descriptors.
Raw sockets against the real gateway: the head, the answer, the body 0.3 s later, then the
server must close the connection."""

from __future__ import annotations

import contextlib
import socket
import time
from urllib.parse import urlparse

import pytest

from .gateway_helpers import API_KEYS

pytestmark = pytest.mark.integration

KEY = f"Authorization: Bearer {API_KEYS[0]}\r\n"
JSON = "Content-Type: application/json\r\n"
# name: (path, extra header lines, declared body length, the status answered before the body)
EARLY = {
    "415-not-json": ("/v1/completions", KEY + "Content-Type: text/plain\r\n", 40, 415),
    "401-no-key": ("/v1/completions", JSON, 40, 401),
    "404-unknown-route": ("/v1/nowhere", KEY + JSON, 40, 404),
    "413-declared-too-big": ("/v1/completions", KEY + JSON, 100_000_000, 413),
}


def _read_to_close(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return data
        except TimeoutError:
            raise AssertionError(f"the connection stayed open after {data[:80]!r}") from None
        if not chunk:
            return data
        data += chunk


@pytest.mark.parametrize("name", sorted(EARLY))
def test_an_answer_before_the_body_closes_the_connection(strict_gateway, name) -> None:
    path, headers, length, status = EARLY[name]
    url = urlparse(strict_gateway.url)
    # far longer than --keep-alive-timeout (5 s): only a connection left open lasts this long
    s = socket.create_connection((url.hostname, url.port), timeout=30)
    try:
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {length}\r\n\r\n".encode()
        )
        time.sleep(0.3)
        with contextlib.suppress(OSError):  # the server may have closed already
            s.sendall(b'{"prompt": "hi", "max_tokens": 1}'.ljust(40))
        answer = _read_to_close(s)
    finally:
        s.close()
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert b"connection: close" in answer.lower()
