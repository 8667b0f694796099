"""A fuzz of the HTTP layer: random bodies and headers against the real gateway and the real
umad. Whatever comes in, the answer is never a 5xx, an error is an OpenAI error object, a
stream ends with [DONE] or an error chunk, neither log shows a traceback, and the core keeps
serving. (The frame fuzz of the core's protocol is tests/unit/test_protocol.py.)

Generation stays cheap: a max_tokens (or max_completion_tokens) the fuzz draws in the range
the core would honour is brought down to a few tokens, so a run stays well under a minute.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from .gateway_helpers import start_gateway, wait_idle

pytestmark = pytest.mark.integration

FIELDS = [
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "user",
    "n", "stream", "stream_options", "service_tier", "priority", "qos", "ignore_eos", "echo",
    "best_of", "suffix", "logprobs", "top_logprobs", "response_format", "tools", "tool_choice",
    "parallel_tool_calls",
]  # fmt: skip
HUGE = [10**30, -(10**30), 2**63, 2**64, -(2**63) - 1, 1e308, -1e308, 5e-324, 10**400]
CHEAP_TOKENS = 3

text = st.text(max_size=40)  # any unicode, surrogates excluded by json.dumps' escaping
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(HUGE)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "developer", "tool"]) | text},
        optional={
            "content": text
            | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2)
            | json_values,
            "name": json_values,
        },
    ),
    max_size=3,
)
field_values = st.one_of(
    st.tuples(st.sampled_from(FIELDS), json_values),
    st.tuples(st.just("messages"), messages),
    st.tuples(st.just("logit_bias"), st.dictionaries(st.integers(-5, 10**7).map(str), scalars)),
    st.tuples(text, json_values),  # an unknown field
)
printable = st.characters(min_codepoint=32, max_codepoint=126)
header_text = st.text(printable, max_size=30).map(str.strip)  # h11 refuses edge spaces
VALID_TYPES = ["application/json", "application/json; charset=utf-8", "Application/JSON;x=1"]
content_types = st.one_of(
    st.sampled_from(VALID_TYPES),
    st.sampled_from(VALID_TYPES),
    st.sampled_from(VALID_TYPES),
    st.sampled_from(["text/plain", "application/x-www-form-urlencoded", "", "application/jsonx"])
    | header_text,
)
unit = st.floats(0, 1)
# well-typed values of the fields both routes know, so that many requests reach the core
valid_fields = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(0, 2),
        "top_p": unit,
        "seed": st.integers(-(2**63), 2**64),
        "stop": text | st.lists(text, max_size=4),
        "presence_penalty": st.floats(-2, 2),
        "frequency_penalty": st.floats(-2, 2),
        "logit_bias": st.dictionaries(
            st.integers(0, 262143).map(str), st.floats(-100, 100), max_size=3
        ),
        "user": text,
        "n": st.integers(1, 3),
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "service_tier": st.sampled_from(["auto", "default", "flex", "priority", "scale"]),
        "priority": st.integers(-5, 5),
        "qos": st.sampled_from(["interactive", "background"]),
        "ignore_eos": st.booleans(),
        "model": st.just("Gemma 3 270m") | text,
    },
)
completion_fields = st.fixed_dictionaries(
    {}, optional={"echo": st.booleans(), "logprobs": st.integers(0, 5), "best_of": st.just(1)}
)
chat_fields = st.fixed_dictionaries(
    {},
    optional={
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 5),
        "max_completion_tokens": st.integers(1, CHEAP_TOKENS),
        "response_format": st.just({"type": "text"}),
        "tool_choice": st.just("none"),
    },
)


def cheap(value: Any) -> Any:
    """An int max_tokens the core would honour becomes a few tokens; anything else stays."""
    if isinstance(value, int) and not isinstance(value, bool) and CHEAP_TOKENS < value <= 4096:
        return CHEAP_TOKENS
    return value


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, str], bytes]:
    route = draw(st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
    if route == "/v1/completions":
        body: Any = {"prompt": draw(text), "max_tokens": CHEAP_TOKENS}
        body.update(draw(completion_fields))
    else:
        body = {"messages": [{"role": "user", "content": draw(text)}], "max_tokens": CHEAP_TOKENS}
        body.update(draw(chat_fields))
    body.update(draw(valid_fields))
    body.update(draw(st.lists(field_values, max_size=3) | st.just([])))  # wrong ones, or none
    for key in ("max_tokens", "max_completion_tokens"):
        if key in body:
            body[key] = cheap(body[key])
    kind = draw(st.sampled_from(["body"] * 8 + ["json", "bytes"]))  # the first is the simplest
    if kind == "bytes":
        raw = draw(st.binary(max_size=64))  # not JSON, or not an object
    elif kind == "json":
        raw = json.dumps(draw(json_values)).encode()  # any JSON value at all
    else:
        raw = json.dumps(body).encode()
    headers = {"Content-Type": draw(content_types)}
    for name, value in draw(
        st.lists(
            st.tuples(
                st.sampled_from(["X-UMA-QoS", "Accept", "X-Request-Id", "Authorization"])
                | st.from_regex(r"X-[A-Za-z0-9-]{1,12}", fullmatch=True),
                header_text,
            ),
            max_size=3,
        )
    ):
        headers[name] = value
    return route, headers, raw


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
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        data = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
        assert data and (data[-1] == "[DONE]" or "error" in json.loads(data[-1])), r.text[-500:]
        errors = [json.loads(d)["error"] for d in data if d != "[DONE]" and '"error"' in d[:10]]
        assert not errors, errors
    else:
        assert r.json()["choices"]


def test_fuzz_http_layer(fuzz_gw, umad, model_id):
    umad_log_at = len(umad.log())
    client = httpx.Client(base_url=fuzz_gw.url, timeout=120)

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(requests())
    def one(request: tuple[str, dict[str, str], bytes]) -> None:
        route, headers, raw = request
        r = client.post(route, content=raw, headers=headers)
        event(f"status {r.status_code}")  # shown by --hypothesis-show-statistics
        check_answer(r)

    try:
        one()
        r = client.post(
            "/v1/completions",
            json={"model": model_id, "prompt": "Hello", "max_tokens": 2},
        )
        assert r.status_code == 200 and r.json()["choices"]
    finally:
        client.close()
    assert wait_idle(umad.socket)["active_sessions"] == 0
    assert umad.proc.poll() is None and fuzz_gw.proc.poll() is None
    assert "Traceback" not in fuzz_gw.log(), fuzz_gw.log()[-3000:]
    new_umad_log = umad.log()[umad_log_at:]
    assert "Traceback" not in new_umad_log, new_umad_log[-3000:]
