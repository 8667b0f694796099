"""The gateway's bytes on the wire: a response's headers and its first body chunk arrive in
one TCP segment (gateway/tcp_cork.py), so the client wakes once for its first token, and the
rest of a stream still flows chunk by chunk."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.integration


def _post(url: str, body: dict) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def _first_segment(sock: socket.socket) -> bytes:
    """What the first read returns, taken as soon as anything arrives (a client that wakes
    for the headers alone sees them alone)."""
    sock.settimeout(60)
    return sock.recv(1 << 16)


def test_headers_and_first_chunk_arrive_together(gateway):
    """A stream's headers wait for its first token, then leave in their own send unless
    corked: without the cork the first read returns the headers alone."""
    body = {"prompt": "Count: one, two,", "max_tokens": 4, "temperature": 0, "stream": True}
    for _ in range(5):  # each try can only pass if the two writes left as one segment
        with _post(gateway.url, body) as sock:
            first = _first_segment(sock)
            assert first.startswith(b"HTTP/1.1 200"), first[:200]
            _, _, rest = first.partition(b"\r\n\r\n")
            assert b"data: {" in rest, f"the headers came alone: {first!r}"


def test_stream_is_not_held_after_the_first_chunk(gateway):
    """Uncorked after the first chunk: later tokens arrive while the stream runs, not in one
    lump at its end."""
    body = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "stream": True}
    body["ignore_eos"] = True
    arrivals: list[tuple[float, int]] = []
    with _post(gateway.url, body) as sock:
        sock.settimeout(60)
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
            arrivals.append((time.perf_counter(), chunk.count(b"data: ")))
    events = sum(n for _, n in arrivals)
    assert events >= 48, data[-300:]
    assert len(arrivals) >= 24, f"{len(arrivals)} reads for {events} events"
