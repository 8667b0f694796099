"""Gateway pieces without a model: schema validation, error mapping, auth, and the app's
answers when no core is there (the Prometheus export: test_prom.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest
from starlette.testclient import TestClient

from uma_serve.clients.client import CoreError
from uma_serve.core import protocol as p
from uma_serve.gateway import openai_schema as schema
from uma_serve.gateway.app import Settings, create_app
from uma_serve.gateway.auth import bearer_of, key_matches
from uma_serve.gateway.errors import ApiError, from_core_error


def decode_error(body: bytes, kind: type = schema.CompletionRequest) -> ApiError:
    with pytest.raises(ApiError) as err:
        schema.decode(body, kind)
    assert err.value.status == 400
    return err.value


def test_completion_request_defaults():
    req = schema.decode(b'{"prompt": "hi", "model": "m"}', schema.CompletionRequest)
    assert req.max_tokens == 16 and req.prompt_text == "hi" and not req.include_usage
    req = schema.decode(
        b'{"prompt": ["x"], "stream": true, "stream_options": {"include_usage": true}}',
        schema.CompletionRequest,
    )
    assert req.prompt_text == "x" and req.include_usage


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"prompt": 1}', "prompt"),
        (b'{"prompt": ["a", "b"]}', "prompt"),
        (b'{"prompt": [1, 2]}', "prompt"),
        (b'{"prompt": "a", "top_p": 1.5}', "top_p"),
        (b'{"prompt": "a", "stop": [' + b",".join([b'"s"'] * 17) + b"]}", "stop"),
        (b'{"prompt": "a", "n": 0}', "n"),
        (b'{"prompt": "a", "n": 17}', "n"),
        (b'{"prompt": "a", "best_of": 2}', "best_of"),
        (b'{"prompt": "a", "suffix": "z"}', "suffix"),
        (b'{"prompt": "a", "logit_bias": {"x": 3}}', "logit_bias"),
        (b'{"prompt": "a", "logit_bias": {"1": -300}}', "logit_bias"),
        (b'{"prompt": "a", "stream_options": {"include_usage": true}}', "stream_options"),
        (b'{"prompt": "a", "stream_options": {"x": 1}, "stream": true}', "stream_options.x"),
        (b'{"prompt": "a", "qos": "urgent"}', "qos"),
        (b"{}", "prompt"),
    ],
)
def test_completion_request_refusals(body, param):
    assert decode_error(body).param == param


def test_logit_bias_keys_become_token_ids():
    req = schema.decode(
        b'{"prompt": "a", "logit_bias": {"17": 2.5, "3": -100}}', schema.CompletionRequest
    )
    assert req.token_bias == {17: 2.5, 3: -100.0}
    assert (
        schema.decode(b'{"prompt": "a", "logit_bias": {}}', schema.CompletionRequest).token_bias
        is None
    )


def test_malformed_and_empty_bodies():
    assert decode_error(b"{nope").code == "invalid_json"
    assert decode_error(b"").param is None
    assert decode_error(b"[]").status == 400


def test_chat_request_messages():
    req = schema.decode(
        json.dumps(
            {
                "messages": [
                    {"role": "developer", "content": "be brief"},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    },
                ],
                "max_completion_tokens": 5,
                "max_tokens": 9,
            }
        ).encode(),
        schema.ChatRequest,
    )
    assert req.core_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
    ]
    assert req.requested_max_tokens == 5 and req.max_tokens_param == "max_completion_tokens"
    bad = b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}'
    with pytest.raises(ApiError):
        schema.decode(bad, schema.ChatRequest).core_messages()
    assert decode_error(b'{"messages": []}', schema.ChatRequest).param == "messages"
    wrong_role = b'{"messages": [{"role": "x", "content": "a"}]}'
    assert decode_error(wrong_role, schema.ChatRequest).param == "messages[0].role"
    tools = b'{"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}'
    assert decode_error(tools, schema.ChatRequest).param == "tools[0].function"


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (p.E_PROTO, 400),
        (p.E_LIMIT, 400),
        (p.E_LIMIT_TOKENS, 400),
        (p.E_BUSY, 429),
        (p.E_SHUTDOWN, 503),
        (p.E_IO, 503),
        (p.E_MODEL, 400),
        (p.E_TEMPLATE, 400),
        (p.E_RUNTIME, 500),
    ],
)
def test_core_error_mapping(code, status):
    err = from_core_error(CoreError(code, "boom"))
    assert err.status == status
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}
    if status in (429, 503):
        assert err.headers["Retry-After"]
    if code == p.E_LIMIT:
        assert err.code == "context_length_exceeded"


def test_auth_helpers():
    keys = [b"alpha", b"beta"]
    assert key_matches("beta", keys) and key_matches("alpha", keys)
    assert not key_matches("gamma", keys) and not key_matches("", keys)
    assert bearer_of(b"Bearer abc") == "abc" and bearer_of(b"bearer  abc ") == "abc"
    assert bearer_of(b"Basic abc") is None and bearer_of(None) is None
    assert bearer_of(b"Bearer ") is None


@pytest.fixture
def no_core_app(tmp_path):
    settings = Settings(
        core_sockets=[str(tmp_path / "none.sock")], api_keys=["k"], max_body_bytes=100
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def test_app_without_core(no_core_app):
    auth = {"Authorization": "Bearer k"}
    assert no_core_app.get("/health").status_code == 503
    assert no_core_app.get("/v1/models").status_code == 401
    r = no_core_app.get("/v1/models", headers=auth)
    assert r.status_code == 503 and r.json()["error"]["code"] == "core_unavailable"
    r = no_core_app.post("/v1/completions", headers=auth, json={"prompt": "x" * 200})
    assert r.status_code == 413
    json_ct = {**auth, "Content-Type": "application/json"}
    r = no_core_app.post("/v1/completions", headers=json_ct, content=b"{oops")
    assert r.status_code == 400
    qos = {**auth, "X-UMA-QoS": "now"}
    r = no_core_app.post("/v1/completions", headers=qos, json={"prompt": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-UMA-QoS"
    r = no_core_app.get("/nowhere")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    m = no_core_app.get("/metrics")
    assert m.status_code == 200 and "uma_core_up 0.0" in m.text
    assert 'uma_http_requests_total{method="GET",route="/v1/models",status="401"}' in m.text


STAINLESS = (
    "authorization, content-type, x-stainless-arch, x-stainless-lang, x-stainless-os, "
    "x-stainless-package-version, x-stainless-retry-count, x-stainless-runtime, "
    "x-stainless-runtime-version, x-stainless-timeout"
)


def test_cors_preflight_passes_before_auth(tmp_path):
    settings = Settings(
        core_sockets=[str(tmp_path / "none.sock")],
        api_keys=["k"],
        cors_origins=["http://app.example"],
    )
    with TestClient(create_app(settings)) as client:
        pre = client.options(
            "/v1/chat/completions",
            headers={
                "Origin": "http://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": STAINLESS,
            },
        )
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "http://app.example"
        # the OpenAI JS SDK's own headers (issue 36): reflected, not a 400
        allowed = {h.strip() for h in pre.headers["access-control-allow-headers"].split(",")}
        assert {h.strip() for h in STAINLESS.split(",")} <= allowed
        other = client.get("/v1/models", headers={"Origin": "http://evil.example"})
        assert other.status_code == 401
        assert "access-control-allow-origin" not in other.headers


def test_no_cors_headers_by_default(no_core_app):
    r = no_core_app.get("/health", headers={"Origin": "http://app.example"})
    assert "access-control-allow-origin" not in r.headers


def test_cli_api_keys_from_flags_or_env(monkeypatch):
    from uma_serve.gateway.main import parser, settings_from

    monkeypatch.setenv("UMA_API_KEY", "a, b,")
    monkeypatch.setenv("UMA_SOCKET", "/run/x.sock")
    s = settings_from(parser().parse_args([]))
    assert s.api_keys == ["a", "b"]
    s = settings_from(parser().parse_args(["--api-key", "c", "--core-socket", "/y.sock"]))
    assert s.api_keys == ["c"] and s.core_sockets == ["/y.sock"]
    monkeypatch.delenv("UMA_API_KEY")
    assert settings_from(parser().parse_args([])).api_keys == []


def test_first_event_turns_a_disconnect_while_waiting_into_client_gone():
    """A client that leaves before its first token: the wait ends with ClientGone (the route
    then closes the core stream, which sends ``cancel``), not when the core answers."""
    import asyncio

    from uma_serve.gateway.streaming import ClientGone, first_event

    class LeavingRequest:
        async def receive(self) -> dict:
            await asyncio.sleep(0.02)
            return {"type": "http.disconnect"}

    async def never() -> AsyncIterator[p.Event]:
        await asyncio.sleep(3600)
        yield p.TokenEvent(id="x", text="late", token_id=1)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ClientGone):
            await first_event(LeavingRequest(), never())  # type: ignore[arg-type]
        return loop.time() - t0

    assert asyncio.run(main()) < 1.0


def test_core_info_is_refreshed_in_the_background():
    """Past its TTL the cached info still answers at once; a fresh one replaces it."""
    import asyncio

    from uma_serve.gateway.core_pool import CorePool

    def info(model: str) -> p.InfoEvent:
        return p.InfoEvent(
            id=None, model=model, model_path="m.gguf", n_ctx=64, n_ctx_per_seq=64, n_seq=1,
            n_vocab=8, chat_template=False, version="0", max_tokens=8, max_prompt_bytes=64,
        )  # fmt: skip

    async def main() -> list[str]:
        pool = CorePool("/nonexistent.sock", info_ttl=0.0)
        answers = iter(["first", "second", "third", "fourth"])

        async def ask(request: p.InfoRequest, answer: type) -> p.InfoEvent:
            await asyncio.sleep(0.01)
            return info(next(answers))

        pool.ask = ask  # type: ignore[method-assign,assignment]
        seen = [(await pool.info()).model]  # nothing cached: waits for the core
        seen.append((await pool.info()).model)  # stale: answered at once, refresh started
        await asyncio.sleep(0.05)
        seen.append((await pool.info()).model)
        await pool.close()
        return seen

    assert asyncio.run(main())[:3] == ["first", "first", "second"]


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        (None, 415),
        ("text/plain", 415),
        ("text/plain;charset=UTF-8", 415),
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
        ("application/jsonp", 415),
        ("application/json", 400),
        ("Application/JSON; charset=utf-8", 400),
    ],
)
def test_generation_bodies_must_be_declared_json(no_core_app, content_type, status):
    """A body a web page may POST cross-origin without a preflight (text/plain, a form) is a
    415 naming Content-Type; application/json (any charset) goes on (here: to a 400, the
    body being empty)."""
    headers = {"Authorization": "Bearer k"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    for route in ("/v1/completions", "/v1/chat/completions"):
        r = no_core_app.post(route, headers=headers, content=b"")
        assert r.status_code == status, r.text
        if status == 415:
            err = r.json()["error"]
            assert err["param"] == "Content-Type" and err["code"] == "unsupported_media_type"
            assert "application/json" in err["message"]


def test_raw_head_errors_are_openai_error_objects():
    from uma_serve.gateway.http_limits import raw_error

    raw = raw_error(431, "request headers over the limit of 10 bytes", "too_large")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ") and b"connection: close" in head
    assert f"content-length: {len(body)}".encode() in head
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == "too_large"


def test_drain_stops_running_requests_after_the_grace():
    from uma_serve.gateway.drain import Drain

    async def scenario() -> None:
        drain = Drain(grace_s=0.01)
        drain.refuse_new()  # not draining: nothing happens
        waiter = asyncio.ensure_future(asyncio.sleep(60))
        stop = drain.add()
        stop.waiting = waiter
        idle = drain.add()  # registered, not waiting: only marked
        drain.begin()
        with pytest.raises(ApiError) as err:
            drain.refuse_new()
        assert err.value.status == 503 and err.value.code == "shutting_down"
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        assert waiter.cancelled() and stop.stopped and idle.stopped
        assert drain.add().stopped  # a late one is stopped at once
        drain.discard(stop)

    asyncio.run(scenario())


def test_tool_grammar_resolves_each_functions_own_refs():
    from uma_serve.gateway import gbnf

    def fn(name: str, kind: str) -> dict:
        defs = {"Inner": {"type": "object", "properties": {"x": {"type": kind}}}}
        props = {"inner": {"$ref": "#/$defs/Inner"}}
        return {"name": name, "parameters": {"type": "object", "properties": props, "$defs": defs}}

    grammar = gbnf.tool_call_grammar([fn("a", "integer"), fn("b", "boolean")], parallel=True)
    assert "root ::=" in grammar and gbnf.TOOL_OPEN in grammar
    assert "integer" in grammar and "boolean" in grammar
    with pytest.raises(ApiError) as info:
        gbnf.json_schema_grammar({"$ref": "#/$defs/Missing"}, "response_format.json_schema.schema")
    assert info.value.param == "response_format.json_schema.schema"
