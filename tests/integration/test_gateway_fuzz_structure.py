"""Structured input against the real gateway and umad: a nesting-depth sweep over every JSON
field of the completion and chat bodies, and a hypothesis fuzz of the grammar and JSON-schema
inputs (``grammar``, ``response_format``, forced ``tools``). Whatever comes in, the answer is
a 200 or a 4xx error object (never a 5xx), neither log shows a traceback, and the core keeps
serving. (The HTTP layer's fuzz: test_gateway_fuzz.py.)"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from .gateway_helpers import start_gateway, wait_idle
from .test_gateway_fuzz import FIELDS

pytestmark = pytest.mark.integration

JSON = {"content-type": "application/json"}
NEST = "__NEST__"
DEPTHS = (3, 65, 1500)
# the fields the top-level sweep cannot reach: a path into a valid body
INNER = {
    "chat": [
        ("messages", 0, "content"),
        ("messages", 0, "name"),
        ("response_format", "json_schema", "schema"),
        ("response_format", "json_schema", "name"),
        ("tools", 0, "function", "parameters"),
        ("tools", 0, "function", "name"),
        ("tool_choice", "function", "name"),
        ("stream_options", "include_usage"),
        ("logit_bias", "1"),
    ],
    "completions": [("stream_options", "include_usage"), ("logit_bias", "1")],
}


def base(route: str) -> dict[str, Any]:
    """A valid cheap body holding every object the inner paths go through."""
    if route == "completions":
        return {"prompt": "Hi", "max_tokens": 2, "stream": True, "stream_options": {},
                "logit_bias": {}}  # fmt: skip
    return {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 2,
        "stream": True,
        "stream_options": {},
        "logit_bias": {},
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }


def nested(depth: int, kind: str) -> str:
    """JSON text nested ``depth`` levels (json.dumps itself recurses)."""
    if kind == "array":
        return "[" * depth + "1" + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


def body_with(route: str, path: tuple[str | int, ...], depth: int, kind: str) -> bytes:
    body = base(route)
    node: Any = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = NEST
    if "response_format" in body and path[0] == "tool_choice":
        del body["response_format"]  # a forced tool_choice excludes it
    return json.dumps(body).replace(f'"{NEST}"', nested(depth, kind)).encode()


def sweep_cases() -> list[tuple[str, tuple[str | int, ...]]]:
    cases = [(route, (field,)) for route in ("completions", "chat") for field in FIELDS]
    return cases + [(route, path) for route, paths in INNER.items() for path in paths]


@pytest.fixture(scope="module")
def fuzz_gw(umad):
    gw = start_gateway(umad.socket)
    yield gw
    gw.stop()


def check_answer(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code != 200:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
    elif r.headers["content-type"].startswith("text/event-stream"):
        data = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
        assert data and data[-1] == "[DONE]", r.text[-500:]


def assert_still_serving(gw, umad, umad_log_at: int) -> None:
    r = httpx.post(
        f"{gw.base_url}/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=120
    )
    assert r.status_code == 200 and r.json()["choices"]
    assert wait_idle(umad.socket)["active_sessions"] == 0
    assert umad.proc.poll() is None and gw.proc.poll() is None
    assert "Traceback" not in gw.log(), gw.log()[-3000:]
    assert "Traceback" not in umad.log()[umad_log_at:], umad.log()[-3000:]


def test_nesting_sweep_over_every_field(fuzz_gw, umad):
    umad_log_at = len(umad.log())
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=fuzz_gw.url, timeout=120) as client:
        for route, path in sweep_cases():
            url = "/v1/completions" if route == "completions" else "/v1/chat/completions"
            for depth in DEPTHS:
                for kind in ("array", "object"):
                    r = client.post(url, content=body_with(route, path, depth, kind), headers=JSON)
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    check_answer(r)
    assert set(statuses) <= {200, 400, 404}, statuses  # 404: a nested `model` names none
    assert_still_serving(fuzz_gw, umad, umad_log_at)


# JSON schemas: small, random, of the keywords the converter knows and some it does not
names = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=8)
scalars = st.none() | st.booleans() | st.integers(-1000, 1000) | names
leaf_schemas = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean",
                                                    "null", "object", "array", "bogus"])},
                          optional={"minLength": st.integers(-1, 5),
                                    "maxLength": st.integers(-1, 5),
                                    "minimum": st.integers(-5, 5), "maximum": st.integers(-5, 5),
                                    "pattern": st.sampled_from(["^a+$", "[", "(a|b)*", "\\d{2}"]),
                                    "format": st.sampled_from(["date", "uuid", "time", "email"])}),
    st.fixed_dictionaries({"enum": st.lists(scalars, max_size=4)}),
    st.fixed_dictionaries({"const": scalars}),
    st.fixed_dictionaries({"$ref": st.sampled_from(["#/$defs/a", "#/nowhere", "http://x/y"])}),
    st.just({}),
)  # fmt: skip
schemas = st.recursive(
    leaf_schemas,
    lambda inner: st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(names, inner, max_size=3)},
            optional={
                "required": st.lists(names, max_size=2),
                "additionalProperties": st.booleans() | inner,
            },
        ),  # fmt: skip
        st.fixed_dictionaries(
            {"type": st.just("array"), "items": inner},
            optional={"minItems": st.integers(-1, 3), "maxItems": st.integers(-1, 3)},
        ),
        st.fixed_dictionaries({"anyOf": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"allOf": st.lists(inner, max_size=2)}),
        st.fixed_dictionaries({"prefixItems": st.lists(inner, max_size=2)}),
        st.fixed_dictionaries(
            {"$defs": st.fixed_dictionaries({"a": inner}), "$ref": st.just("#/$defs/a")}
        ),
    ),
    max_leaves=8,
)
# GBNF: pieces of valid syntax and of broken syntax, joined at random
GBNF_PIECES = ['root ::= ', '"a"', '"b"*', '[a-z]+', '( "x" | "y" )', 'other', 'other ::= "o"',
               '\n', ' ', '|', '(', ')', '[', ']', '"', '::=', '{1,3}', '{2}', '?', '*', '+',
               '\\', '# c\n', '[^"]', '"\\u00e9"', 'root', '.']  # fmt: skip
grammars = st.lists(st.sampled_from(GBNF_PIECES), min_size=1, max_size=14).map("".join)


@st.composite
def structured(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    kind = draw(st.sampled_from(["grammar", "format", "tools"]))
    if kind == "grammar":
        text = draw(grammars | st.builds("root ::= {}".format, grammars))
        return "/v1/completions", {"prompt": "Hi", "max_tokens": 3, "grammar": text}
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    schema = draw(schemas | st.dictionaries(names, scalars, max_size=3))
    if kind == "format":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": draw(st.booleans())},
        }
    else:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        body["tool_choice"] = draw(st.sampled_from(["required", "auto"]))
    body["stream"] = draw(st.booleans())
    return "/v1/chat/completions", body


def test_fuzz_grammars_and_schemas(fuzz_gw, umad):
    umad_log_at = len(umad.log())
    client = httpx.Client(base_url=fuzz_gw.url, timeout=120)
    seen: set[int] = set()

    @settings(
        max_examples=120,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(structured())
    def one(request: tuple[str, dict[str, Any]]) -> None:
        route, body = request
        r = client.post(route, json=body)
        event(f"status {r.status_code}")
        seen.add(r.status_code)
        check_answer(r)

    try:
        one()
    finally:
        client.close()
    assert {200, 400} <= seen, seen  # some constrained answers, some refusals
    assert_still_serving(fuzz_gw, umad, umad_log_at)
