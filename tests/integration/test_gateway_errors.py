"""Bad input and bad conditions: each gets its status, an OpenAI error object and no leak.

Where the SDK cannot produce the input (malformed JSON, wrong types), raw HTTP is used; the
error shape is then checked by hand. Everything else goes through the SDK's own exceptions.
"""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from conftest import start_daemon

from .gateway_helpers import API_KEYS, start_gateway, wait_idle

pytestmark = pytest.mark.integration


def assert_error_object(r: httpx.Response, status: int, param: str | None = "any") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param != "any":
        assert err["param"] == param
    return err


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_malformed_json(gateway, route):
    r = httpx.post(
        f"{gateway.base_url}/{route}",
        content=b'{"prompt": "hi", ',
        headers={"content-type": "application/json"},
    )
    assert_error_object(r, 400)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": 42}, "prompt"),
        ({"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
        ({"prompt": "hi", "temperature": "hot"}, "temperature"),
        ({"prompt": "hi", "temperature": 7}, "temperature"),
        ({"prompt": "hi", "stream": "yes"}, "stream"),
        ({"prompt": "hi", "stop": [1, 2]}, "stop"),
        ({"max_tokens": 4}, "prompt"),
        ([1, 2, 3], None),
    ],
)
def test_completion_wrong_fields(gateway, body, param):
    r = httpx.post(f"{gateway.base_url}/completions", json=body)
    err = assert_error_object(r, 400)
    if param:
        assert err["param"] is not None and err["param"].startswith(param)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ],
)
def test_chat_wrong_fields(gateway, body, param):
    r = httpx.post(f"{gateway.base_url}/chat/completions", json=body)
    err = assert_error_object(r, 400)
    assert err["param"] == param


def test_missing_prompt_via_sdk(sdk, model_id):
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model=model_id, prompt=None, max_tokens=4)  # type: ignore[arg-type]
    assert err.value.param == "prompt"


@pytest.mark.parametrize("n", [0, -3])
def test_max_tokens_not_positive(sdk, model_id, n):
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model=model_id, prompt="hi", max_tokens=n)
    assert err.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=n
        )
    assert err.value.param == "max_completion_tokens"


def test_max_tokens_over_limit(sdk, model_id):
    limit = 512  # the session daemon's --max-tokens
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model=model_id, prompt="hi", max_tokens=limit + 1)
    assert err.value.param == "max_tokens" and str(limit) in err.value.message
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=limit + 1,
            stream=True,
        )


def test_prompt_over_core_limit(sdk, model_id):
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model=model_id, prompt="word " * 5000, max_tokens=4)
    assert err.value.code == "context_length_exceeded"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"best_of": 3}, "best_of"),
        ({"suffix": "end"}, "suffix"),
        ({"logprobs": 6}, "logprobs"),
        ({"logprobs": 1, "echo": True}, "logprobs"),
    ],
)
def test_unsupported_options_are_refused_not_ignored(sdk, model_id, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model=model_id, prompt="hi", max_tokens=4, **extra)
    assert err.value.param == param


def test_chat_top_logprobs_needs_logprobs(sdk, model_id):
    for extra, param in (
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            sdk.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=2, **extra
            )
        assert err.value.param == param


@pytest.mark.parametrize(
    ("bias", "words"),
    [
        ({"forty": 5}, "token ids"),
        ({"-2": 5}, "token ids"),
        ({"42": 101}, "100"),
        ({"42": "high"}, "float"),
        ({"99999999": 5}, "not in the vocabulary"),
        ({"262144": 5}, "not in the vocabulary"),  # the embedded model's vocabulary size
        ({"1" * 40: 5}, "not in the vocabulary"),
    ],
)
def test_bad_logit_bias(sdk, model_id, bias, words):
    for call in (
        lambda: sdk.completions.create(model=model_id, prompt="hi", max_tokens=2, logit_bias=bias),
        lambda: sdk.chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            logit_bias=bias,
            stream=True,
        ),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert words in str(err.value.message)
        assert err.value.param == "logit_bias"
        if words in ("token ids", "not in the vocabulary"):
            assert err.value.code == "invalid_value"  # OpenAI's, not a core code


def test_nul_byte_is_a_400_naming_the_field(sdk, model_id):
    """A NUL would cut the text short in llama.cpp's tokenizer: the client's error, not ours."""
    calls = {
        "prompt": lambda: sdk.completions.create(model=model_id, prompt="a\x00b", max_tokens=2),
        "messages[0].content": lambda: sdk.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "\x00"}], max_tokens=2
        ),
    }
    for param, call in calls.items():
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.param == param and err.value.code == "invalid_value"
        assert "NUL" in str(err.value.message)


def test_unknown_route(gateway, sdk):
    assert_error_object(httpx.get(f"{gateway.base_url}/engines"), 404)
    with pytest.raises(openai.NotFoundError):
        sdk.embeddings.create(model="x", input="hi")


def test_body_too_large(gateway, strict_gateway, model_id):
    big = "x" * (2 << 20)
    with pytest.raises(openai.APIStatusError) as err:
        gateway.client().completions.create(model=model_id, prompt=big, max_tokens=4)
    assert err.value.status_code == 413
    r = httpx.post(
        f"{strict_gateway.base_url}/completions",
        json={"prompt": "y" * 70000},
        headers={"Authorization": f"Bearer {API_KEYS[0]}"},
    )
    assert_error_object(r, 413)


def test_auth(strict_gateway, model_id):
    with pytest.raises(openai.AuthenticationError):
        strict_gateway.client(api_key="wrong-key").models.list()
    r = httpx.get(f"{strict_gateway.base_url}/models")
    assert_error_object(r, 401)
    r = httpx.post(f"{strict_gateway.base_url}/completions", json={"prompt": "x"})
    assert_error_object(r, 401)
    for key in API_KEYS:
        client = strict_gateway.client(api_key=key)
        assert client.models.list().data[0].id == model_id
    r = client.completions.create(model=model_id, prompt="hi", max_tokens=2)
    assert r.choices
    assert httpx.get(f"{strict_gateway.url}/health").status_code == 200


def test_auth_off_takes_any_key(gateway):
    assert gateway.client(api_key="anything").models.list().data


def test_too_many_in_flight(strict_gateway, umad, model_id):
    client = strict_gateway.client(api_key=API_KEYS[0])
    stream = client.completions.create(
        model=model_id, prompt="Once upon a time", max_tokens=200, stream=True
    )
    first = next(iter(stream))  # the one slot is now held by this stream
    assert first.choices
    try:
        with pytest.raises(openai.RateLimitError) as err:
            client.completions.create(model=model_id, prompt="hi", max_tokens=2)
        assert err.value.response.headers["retry-after"]
    finally:
        stream.close()
    wait_idle(umad.socket)
    assert client.completions.create(model=model_id, prompt="hi", max_tokens=2).choices


def test_core_down(fresh_tmp):
    gw = start_gateway(str(fresh_tmp / "nobody-home.sock"), log_dir=fresh_tmp)
    try:
        client = gw.client()
        with pytest.raises(openai.InternalServerError) as err:
            client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert err.value.status_code == 503
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        assert err.value.status_code == 503
        with pytest.raises(openai.InternalServerError):
            client.models.list()
        r = httpx.get(f"{gw.url}/health")
        assert r.status_code == 503 and r.json()["reason"]
        metrics = httpx.get(f"{gw.url}/metrics")
        assert metrics.status_code == 200 and "uma_core_up 0.0" in metrics.text
    finally:
        gw.stop()


def test_core_pool_warms_up_at_start_and_tolerates_a_missing_core(umad, fresh_tmp):
    """The gateway opens its core connections and reads the core's info at start-up (the
    first requests do not pay for them); with no core there, start-up goes on regardless."""
    import asyncio

    from uma_serve.gateway.core_pool import CorePool

    async def warm(path: str) -> tuple[list, object]:
        pool = CorePool(path, size=3)
        await pool.warm()
        state = ([s is not None and not s.closed for s in pool._slots], pool._info)
        await pool.close()
        return state

    live, info = asyncio.run(warm(umad.socket))
    assert live == [True, True, True] and info is not None and info.model
    live, info = asyncio.run(warm(str(fresh_tmp / "nobody-home.sock")))
    assert live == [False, False, False] and info is None


def test_concurrent_bad_and_good_requests_leak_nothing(gateway, umad, model_id):
    """A mix of refused and served requests at once; afterwards no sequence is held."""
    client = gateway.client()
    errors: list[BaseException] = []

    def good() -> None:
        try:
            client.completions.create(model=model_id, prompt="Hello", max_tokens=4)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def bad() -> None:
        try:
            client.completions.create(model=model_id, prompt="Hello", max_tokens=10**6)
        except openai.BadRequestError:
            return
        errors.append(AssertionError("max_tokens over limit was accepted"))

    threads = [threading.Thread(target=f) for f in (good, bad, good, bad, good)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    m = wait_idle(umad.socket)
    assert m["active_sessions"] == 0 and m["waiting_sessions"] == 0
    assert gateway.proc.poll() is None


def test_core_busy_is_429_before_any_token(fresh_tmp):
    """The core's own bound (E_BUSY_001) reaches the client as a real 429, stream or not."""
    daemon = start_daemon(fresh_tmp, "--n-seq", "1", "--max-sessions", "1", "--n-ctx", "512")
    gw = start_gateway(daemon.socket, log_dir=fresh_tmp)
    try:
        client = gw.client()
        model = client.models.list().data[0].id
        holder = client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=200, stream=True
        )
        assert next(iter(holder)).choices
        try:
            with pytest.raises(openai.RateLimitError) as err:
                client.completions.create(model=model, prompt="hi", max_tokens=2, stream=True)
            assert err.value.response.headers["retry-after"]
            with pytest.raises(openai.RateLimitError):
                client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
        finally:
            holder.close()
        assert wait_idle(daemon.socket)["active_sessions"] == 0
        assert client.completions.create(model=model, prompt="hi", max_tokens=2).choices
    finally:
        gw.stop()
        daemon.stop()
