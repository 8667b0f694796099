"""Hostile bodies: bytes that are not UTF-8 and structures nested past any real schema get a
400 naming what is wrong (never a 500 with exception text), and the core keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from .gateway_helpers import wait_idle

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


def nested_schema(levels: int) -> str:
    """A JSON schema of arrays ``levels`` deep (its own object counts as one), as raw text:
    json.dumps itself recurses."""
    return '{"type": "array", "items": ' * (levels - 1) + '{"type": "string"}' + "}" * (levels - 1)


def chat_with(field: str, schema: str) -> bytes:
    """A chat body whose tool ``f``'s parameters, or whose response format, is ``schema``."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    if field == "tools":
        body["tools"] = [
            {"type": "function", "function": {"name": "g"}},
            {"type": "function", "function": {"name": "f", "parameters": "SCHEMA"}},
        ]
    else:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": "SCHEMA"},
        }
    return json.dumps(body).replace('"SCHEMA"', schema).encode()


PARAMS = {"tools": "tools[1].function.parameters", "format": "response_format.json_schema.schema"}


@pytest.mark.parametrize("levels", [65, 1500, 20000])
@pytest.mark.parametrize("field", ["tools", "format"])
def test_schemas_nested_too_deep_are_a_400_naming_the_field(gateway, umad, field, levels):
    raw = chat_with(field, nested_schema(levels))
    r = httpx.post(f"{gateway.base_url}/chat/completions", content=raw, headers=JSON, timeout=60)
    err = error_of(r)
    assert err["param"] == PARAMS[field] and err["code"] == "invalid_value"
    assert "nested more than 64 levels" in err["message"]
    assert "Traceback" not in gateway.log()


@pytest.mark.parametrize("field", ["tools", "format"])
def test_a_schema_64_levels_deep_is_served(gateway, umad, field):
    raw = chat_with(field, nested_schema(64))
    r = httpx.post(f"{gateway.base_url}/chat/completions", content=raw, headers=JSON, timeout=120)
    assert r.status_code == 200, r.text
    assert wait_idle(umad.socket)["active_sessions"] == 0
