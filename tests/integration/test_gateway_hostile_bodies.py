"""Hostile bodies: bytes that are not UTF-8 and structures nested past any real schema get a
400 naming what is wrong (never a 500 with exception text), and the core keeps serving."""

from __future__ import annotations

import httpx
import pytest

from .gateway_fixtures import *  # noqa: F403
from .gateway_fixtures import wait_idle

pytestmark = pytest.mark.integration

JSON = {"content-type": "application/json"}
BAD_UTF8 = [
    ("/v1/completions", b'{"prompt": "a\xffb", "max_tokens": 2}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\xffb"}]}'),
    ("/tokenize", b'{"content": "a\xffb"}'),
    ("/detokenize", b'{"tokens": [1], "model": "\xc3("}'),
    ("/v1/completions", b'{"prompt": "hi", "\xfe": 1}'),  # in a key
]


def error_of(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


@pytest.mark.parametrize(("route", "raw"), BAD_UTF8)
def test_bytes_that_are_not_utf8_are_a_400(gateway, umad, route, raw):
    r = httpx.post(f"{gateway.url}{route}", content=raw, headers=JSON, timeout=60)
    err = error_of(r)
    assert err["code"] == "invalid_request" and "not valid UTF-8" in err["message"]
    assert "codec" not in err["message"]  # no Python exception text
    assert "Traceback" not in gateway.log()
    ok = httpx.post(f"{gateway.url}/tokenize", json={"content": "ab"}, timeout=60)
    assert ok.status_code == 200 and ok.json()["tokens"]
    assert wait_idle(umad.socket)["active_sessions"] == 0
