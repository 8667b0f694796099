"""Faults from outside the gateway, each against the real uma-gateway under uvicorn and the real
umad (docs/RELIABILITY.md, "The gateway"): slow and oversized requests, clients that leave,
SIGTERM during streams, bodies not declared JSON, the core going away under /v1/models."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import time
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from conftest import start_daemon

from .gateway_helpers import Gateway, start_gateway, wait_idle

pytestmark = pytest.mark.integration

STREAM = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}


def connect(gw: Gateway, timeout: float = 60) -> socket.socket:
    parts = urlsplit(gw.url)
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.settimeout(timeout)
    return sock


def head(path: str, length: int | None = None, ctype: str = "application/json") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gw", f"Content-Type: {ctype}"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def post_raw(gw: Gateway, body: dict, path: str = "/v1/completions") -> socket.socket:
    data = json.dumps(body).encode()
    sock = connect(gw)
    sock.sendall(head(path, len(data)) + data)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def parse_response(raw: bytes) -> tuple[int, bytes]:
    """Status and body of one answer (chunked bodies joined)."""
    head_, _, body = raw.partition(b"\r\n\r\n")
    status = int(head_.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head_.lower():
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2 :]
        body = out
    return status, body


def error_of(body: bytes) -> dict:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def sse_data(body: bytes) -> list[str]:
    return [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]


def http_counts(gw: Gateway) -> dict[tuple[str, str], float]:
    """uma_http_requests_total by (route, status)."""
    text = httpx.get(f"{gw.url}/metrics").text
    pattern = r'uma_http_requests_total\{method="\w+",route="([^"]+)",status="(\d+)"\} (\S+)'
    return {(r, s): float(v) for r, s, v in re.findall(pattern, text)}


def assert_clean_log(gw: Gateway) -> None:
    log = gw.log()
    assert "Traceback" not in log and "negative file descriptor" not in log, log[-3000:]


@pytest.fixture(scope="module")
def slow_gw(umad):
    """One generation in flight at most, short body and head deadlines."""
    gw = start_gateway(
        umad.socket, "--max-inflight", "1", "--body-timeout", "2", "--header-timeout", "2"
    )
    yield gw
    gw.stop()


def test_a_trickled_body_gets_408_and_holds_no_slot(slow_gw, umad, model_id):
    """Headers sent, body trickled: others are served meanwhile (with --max-inflight 1), the
    slow one gets 408 with an error object once --body-timeout passes, and the connection
    closes."""
    slow = connect(slow_gw)
    slow.sendall(head("/v1/completions", 200) + b'{"prompt": "slo')
    client = slow_gw.client()
    for _ in range(2):
        r = client.completions.create(model=model_id, prompt="Hello", max_tokens=2)
        assert r.choices[0].text is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            slow.sendall(b"w")  # still trickling (unless the 408 came already)
    status, body = parse_response(read_until_closed(slow))
    assert status == 408
    err = error_of(body)
    assert err["code"] == "request_timeout" and "--body-timeout" in err["message"]
    assert client.completions.create(model=model_id, prompt="Hello", max_tokens=2).choices
    assert "uma_http_inflight_requests 0.0" in httpx.get(f"{slow_gw.url}/metrics").text
    assert wait_idle(umad.socket)["active_sessions"] == 0
    assert_clean_log(slow_gw)


def test_an_oversized_head_is_refused(slow_gw):
    """A head over --max-header-bytes (64 KiB by default) is a 431 error object, whether the
    client sends it in one piece or keeps writing (1 MiB); a normal head still works."""
    r = httpx.get(f"{slow_gw.url}/health", headers={"X-Big": "x" * 100_000})
    assert r.status_code == 431 and error_of(r.content)["code"]
    sock = connect(slow_gw)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused while writing
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Big: " + b"x" * (1 << 20))
    status, body = parse_response(read_until_closed(sock))
    assert status == 431 and "limit" in error_of(body)["message"]
    assert httpx.get(f"{slow_gw.url}/health", headers={"X-Ok": "x" * 1000}).status_code == 200


def test_a_partial_head_gets_408(slow_gw):
    """Half a head, then silence: 408 once --header-timeout passes, and the connection
    closes (it no longer holds a connection forever)."""
    sock = connect(slow_gw)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: appl")
    status, body = parse_response(read_until_closed(sock))
    assert status == 408 and error_of(body)["code"] == "request_timeout"
    assert_clean_log(slow_gw)


def test_disconnects_are_499_without_a_traceback(umad, fresh_tmp, model_id):
    """Clients that leave at any point of a stream (before its first token, reset at once,
    mid-stream) are counted 499, never 500, and leave no traceback in the log (uvloop's
    closed socket has the descriptor -1: corking it raised ValueError)."""
    gw = start_gateway(umad.socket, log_dir=fresh_tmp)
    try:
        n = 0
        for delay in (0.0, 0.001, 0.005, 0.02, 0.1):
            sock = post_raw(gw, STREAM)
            time.sleep(delay)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")  # RST
            sock.close()
            n += 1
        for path, body in (
            ("/v1/completions", STREAM),
            ("/v1/chat/completions", {**STREAM, "messages": [{"role": "user", "content": "Hi"}]}),
        ):
            if "messages" in body:
                body = {k: v for k, v in body.items() if k != "prompt"}
            sock = post_raw(gw, body, path)
            assert sock.recv(1 << 16).startswith(b"HTTP/1.1 200")  # a first token arrived
            sock.close()
            n += 1
        assert wait_idle(umad.socket)["active_sessions"] == 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            counts = http_counts(gw)
            gone = sum(v for (_, s), v in counts.items() if s == "499")
            if gone >= n:
                break
            time.sleep(0.2)
        assert gone == n, counts
        assert not [k for k in counts if k[1].startswith("5")], counts
        assert gw.client().completions.create(model=model_id, prompt="Hi", max_tokens=2).choices
        assert_clean_log(gw)
    finally:
        gw.stop()


def test_sigterm_ends_running_streams_with_an_error_chunk(umad, fresh_tmp):
    """SIGTERM while streams run: no new connection is taken, each stream ends with an
    error chunk (code shutting_down) and data: [DONE], or completes; the gateway exits 0
    with no traceback, and the core holds no request afterwards."""
    gw = start_gateway(umad.socket, "--shutdown-grace", "0", log_dir=fresh_tmp)
    try:
        chat = {k: v for k, v in STREAM.items() if k != "prompt"}
        chat["messages"] = [{"role": "user", "content": "Tell me a long story."}]
        socks = [post_raw(gw, STREAM), post_raw(gw, chat, "/v1/chat/completions")]
        firsts = [sock.recv(1 << 16) for sock in socks]
        assert all(first.startswith(b"HTTP/1.1 200") for first in firsts), firsts
        gw.proc.send_signal(signal.SIGTERM)
        cut = 0
        for sock, first in zip(socks, firsts, strict=True):
            status, body = parse_response(first + read_until_closed(sock))
            assert status == 200
            data = sse_data(body)
            assert data[-1] == "[DONE]", body[-500:]
            last = json.loads(data[-2])
            if "error" in last:
                cut += 1
                assert last["error"]["code"] == "shutting_down"
                assert last["error"]["type"] == "server_error"
            else:
                assert last["choices"][0]["finish_reason"] == "length"
            sock.close()
        assert cut > 0  # 400 tokens do not all come within a grace of 0 s
        assert gw.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises it once done
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{gw.url}/health", timeout=5)
        assert wait_idle(umad.socket)["active_sessions"] == 0
        assert_clean_log(gw)
    finally:
        gw.stop()


def test_the_sdk_sees_a_shutdown_mid_stream_as_an_api_error(umad, fresh_tmp, model_id):
    gw = start_gateway(umad.socket, "--shutdown-grace", "0", log_dir=fresh_tmp)
    try:
        stream = gw.client().completions.create(
            model=model_id,
            prompt="Once upon a time",
            max_tokens=400,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = iter(stream)
        assert next(chunks).choices
        gw.proc.send_signal(signal.SIGTERM)
        with pytest.raises(openai.APIError) as err:
            for _ in chunks:
                pass
        assert "shutting down" in str(err.value)
        assert gw.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises it once done
        assert_clean_log(gw)
    finally:
        gw.stop()


def test_sigterm_answers_waiting_requests_with_503(fresh_tmp):
    """With one sequence in the core, a stream holds it while another stream (no token yet)
    and a whole request wait for it: on SIGTERM the holder ends with the error chunk, the
    two waiting get a real 503 shutting_down, and the core is left with nothing."""
    daemon = start_daemon(fresh_tmp, "--n-seq", "1", "--n-ctx", "1024", "--max-sessions", "8")
    gw = start_gateway(daemon.socket, "--shutdown-grace", "0", log_dir=fresh_tmp)
    try:
        holder = post_raw(gw, STREAM)
        first = holder.recv(1 << 16)
        assert first.startswith(b"HTTP/1.1 200")
        whole = {k: v for k, v in STREAM.items() if k != "stream"}
        waiting = [post_raw(gw, STREAM), post_raw(gw, whole)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if daemon.metrics()["waiting_sessions"] == 2:
                break
            time.sleep(0.1)
        assert daemon.metrics()["waiting_sessions"] == 2
        gw.proc.send_signal(signal.SIGTERM)
        status, body = parse_response(first + read_until_closed(holder))
        data = sse_data(body)
        assert status == 200 and data[-1] == "[DONE]"
        assert json.loads(data[-2])["error"]["code"] == "shutting_down"
        for sock in waiting:
            raw = read_until_closed(sock)
            status, body = parse_response(raw)
            assert status == 503, raw[:500]
            assert error_of(body)["code"] == "shutting_down" and b"retry-after" in raw.lower()
        assert gw.proc.wait(30) in (0, -signal.SIGTERM)
        m = wait_idle(daemon.socket)
        assert m["active_sessions"] == 0 and m["waiting_sessions"] == 0
        assert_clean_log(gw)
    finally:
        gw.stop()
        daemon.stop()


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"],
)
def test_bodies_not_declared_json_are_415(gateway, content_type):
    """What a web page may POST cross-origin with no CORS preflight never reaches the core."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    for route in ("completions", "chat/completions"):
        r = httpx.post(f"{gateway.base_url}/{route}", content=body, headers=headers)
        assert r.status_code == 415, r.text
        err = error_of(r.content)
        assert err["code"] == "unsupported_media_type" and err["param"] == "Content-Type"
    ok = {"Content-Type": "application/json; charset=utf-8"}
    r = httpx.post(f"{gateway.base_url}/completions", content=body, headers=ok, timeout=60)
    assert r.status_code == 200, r.text


def test_models_is_503_while_the_core_is_down(fresh_tmp):
    """/v1/models asks the core: 503 with an error object while it is down (not the cached
    model), 200 again once it is back on the same socket."""
    daemon = start_daemon(fresh_tmp, "--n-seq", "1", "--n-ctx", "512")
    gw = start_gateway(daemon.socket, log_dir=fresh_tmp)
    try:
        client = gw.client()
        model = client.models.list().data[0].id
        daemon.stop()
        r = httpx.get(f"{gw.base_url}/models")
        assert r.status_code == 503 and r.headers["retry-after"]
        assert error_of(r.content)["code"] == "core_unavailable"
        assert httpx.get(f"{gw.base_url}/models/{model}").status_code == 503
        with pytest.raises(openai.InternalServerError):
            client.models.list()
        daemon = start_daemon(fresh_tmp, "--n-seq", "1", "--n-ctx", "512")
        assert client.models.list().data[0].id == model
        assert client.completions.create(model=model, prompt="Hi", max_tokens=2).choices
        assert_clean_log(gw)
    finally:
        gw.stop()
        daemon.stop()
