"""What a client may learn, and from whom an error is: no socket path in an answer, redirects
that stay on this server, duplicate keys read as llama-server and vLLM read them, and a
malformed reply from the core is the gateway's 502, not the client's 400."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from uma_serve.core import protocol as p

from .gateway_helpers import start_gateway

pytestmark = pytest.mark.integration


def test_core_down_answers_name_no_path(fresh_tmp):
    where = fresh_tmp / "private-dir-name"
    where.mkdir()
    gw = start_gateway(str(where / "uma.sock"), log_dir=fresh_tmp)
    try:
        answers = [
            httpx.post(f"{gw.base_url}/completions", json={"prompt": "hi"}),
            httpx.post(f"{gw.url}/tokenize", json={"content": "hi"}),
            httpx.get(f"{gw.base_url}/models"),
            httpx.get(f"{gw.url}/health"),
        ]
        for r in answers:
            assert r.status_code == 503, r.text
            assert "private-dir-name" not in r.text and "uma.sock" not in r.text, r.text
        assert "cannot connect to the core" in answers[0].json()["error"]["message"]
        assert "private-dir-name" in gw.log()  # the operator's side says where
    finally:
        gw.stop()


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/tokenize/"), ("POST", "/v1/completions/"), ("GET", "/health//")]
)
def test_trailing_slash_redirect_is_relative(gateway, method, path):
    r = httpx.request(
        method, f"{gateway.url}{path}?x=1", headers={"Host": "evil.example"}, timeout=30
    )
    assert r.status_code == 307
    assert r.headers["location"] == f"{path.rstrip('/')}?x=1"


def test_unknown_paths_with_a_slash_are_404(gateway):
    for path in ("//evil.example/", "/nothing/", "/v1/"):
        r = httpx.get(f"{gateway.url}{path}", headers={"Host": "evil.example"})
        assert r.status_code == 404 and "location" not in r.headers


def test_duplicate_keys_take_the_last_value(gateway, model_id):
    """As llama-server (nlohmann::json) and vLLM (Python's json) read them."""
    raw = b'{"prompt": "Hello", "max_tokens": 100000, "max_tokens": 2, "temperature": 0}'
    r = httpx.post(
        f"{gateway.base_url}/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 2
    raw = b'{"content": "x", "content": "hello world"}'
    two = httpx.post(
        f"{gateway.url}/tokenize", content=raw, headers={"content-type": "application/json"}
    )
    one = httpx.post(f"{gateway.url}/tokenize", json={"content": "hello world"})
    assert two.json() == one.json()


@pytest.fixture
def garbling_core(fresh_tmp: Path) -> Iterator[str]:
    """A socket that answers every frame with one that is not a protocol event."""
    path = str(fresh_tmp / "garbling.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()

    def serve_one(conn: socket.socket) -> None:
        with conn:
            while conn.recv(65536):
                conn.sendall(p.HEADER.pack(21) + b'{"event": "whatever"}')

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield path
    server.close()


def test_a_malformed_core_reply_is_a_502(garbling_core, fresh_tmp):
    gw = start_gateway(garbling_core, log_dir=fresh_tmp)
    try:
        for r in (
            httpx.post(f"{gw.base_url}/completions", json={"prompt": "hi"}),
            httpx.post(f"{gw.url}/tokenize", json={"content": "hi"}),
        ):
            assert r.status_code == 502, r.text
            err = r.json()["error"]
            assert err["type"] == "server_error" and err["code"] == "bad_core_reply"
            assert "whatever" not in err["message"]
        assert "bad reply from the core" in gw.log() and "Traceback" not in gw.log()
    finally:
        gw.stop()


@pytest.mark.parametrize(
    "head",
    [
        b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
        b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n",  # TLS spoken to plain HTTP
    ],
)
def test_a_request_that_does_not_parse_is_an_openai_400(gateway, head):
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 400 "), answer
    head_part, _, body = rest.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head_part.lower()
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "invalid_http_request"
