"""Lenient request fields through the real gateway and core: the sampling extras reach the
core's sampler, unknown fields at any depth are ignored and listed, --strict-fields refuses."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from .gateway_helpers import Gateway, start_gateway
from .helpers import Daemon, gen, start_daemon

PROMPT = "The list of colors: red, blue, green, red, blue, green, red,"
BASE = {"prompt": PROMPT, "max_tokens": 24, "temperature": 1.5, "seed": 7}


@pytest.fixture(scope="module")
def det_core(tmp_path_factory) -> Iterator[tuple[Daemon, Gateway]]:
    """A --deterministic core and its gateway: the same sampled text from the same request,
    whatever the prefix cache held before (on the shared core a cached prompt's numerics may
    turn a near-tie at temperature 1.5; docs/MEMORY.md, "Reproducible greedy output")."""
    core = start_daemon(tmp_path_factory.mktemp("det"), "--deterministic", "on")
    gw = start_gateway(core.socket)
    yield core, gw
    gw.stop()
    core.stop()


@pytest.fixture(scope="module")
def strict_fields_gateway(umad) -> Iterator[Gateway]:
    gw = start_gateway(umad.socket, "--strict-fields")
    yield gw
    gw.stop()


def _gateway_text(gw: Gateway, **fields) -> httpx.Response:
    return httpx.post(f"{gw.base_url}/completions", json={**BASE, **fields}, timeout=120)


def _core_text(umad, **fields) -> str:
    with umad.client() as c:
        ev = c.complete(gen(PROMPT, max_tokens=24, temperature=1.5, seed=7, stream=False, **fields))
    return ev.text


@pytest.mark.parametrize(
    ("extra", "core"),
    [
        ({"top_k": 1}, {"top_k": 1}),
        ({"min_p": 1.0}, {"min_p": 1.0}),
        ({"repeat_penalty": 3.0}, {"repeat_penalty": 3.0}),
        ({"repetition_penalty": 3.0}, {"repeat_penalty": 3.0}),
    ],
)
def test_sampling_extra_reaches_the_core(det_core, extra, core) -> None:
    """The gateway's answer with the extra is the core's with its own field, which differs
    from the core's without it (so the field is observable, not a no-op)."""
    umad, gateway = det_core
    r = _gateway_text(gateway, **extra)
    assert r.status_code == 200, r.text
    assert "x-uma-ignored-fields" not in r.headers
    with_field = _core_text(umad, **core)
    assert r.json()["choices"][0]["text"] == with_field
    assert _core_text(umad) != with_field


def test_top_k_minus_one_is_off(det_core) -> None:
    """vLLM's top_k -1 (no truncation) is the core's 0."""
    umad, gateway = det_core
    r = _gateway_text(gateway, top_k=-1)
    assert r.json()["choices"][0]["text"] == _core_text(umad, top_k=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("top_k", -2), ("min_p", 1.5), ("repeat_penalty", 0), ("repetition_penalty", "x")],
)
def test_bad_sampling_extra_is_a_400_naming_it(gateway, field, value) -> None:
    r = _gateway_text(gateway, **{field: value})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field


def _dumped_chat(model_id: str) -> dict:
    """A chat body as clients build it: unknown top-level fields, a message from the SDK's
    ``model_dump()`` (annotations: null, audio: null...), a part with cache_control."""
    from openai.types.chat import ChatCompletionMessage

    earlier = ChatCompletionMessage(role="assistant", content="Hello.").model_dump()
    return {
        "model": model_id,
        "messages": [
            {"role": "user", "content": "Hi."},
            earlier,
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "One word.", "cache_control": {"type": "ephemeral"}}
                ],
            },
        ],
        "max_tokens": 4,
        "temperature": 0,
        "store": False,
        "metadata": {"k": "v"},
        "reasoning_effort": "low",
        "prompt_cache_key": "abc",
        "verbosity": "low",
        "modalities": ["text"],
        "prediction": None,
        "typical_p": 0.9,
    }


def test_unknown_fields_are_ignored_and_listed(gateway, model_id) -> None:
    body = _dumped_chat(model_id)
    r = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    listed = set(r.headers["x-uma-ignored-fields"].split(", "))
    assert {"store", "metadata", "typical_p"} <= listed
    assert {"messages.annotations", "messages.content.cache_control"} <= listed
    assert r.json()["choices"][0]["message"]["content"]
    streamed = httpx.post(
        f"{gateway.base_url}/chat/completions", json={**body, "stream": True}, timeout=120
    )
    assert streamed.status_code == 200
    assert "store" in streamed.headers["x-uma-ignored-fields"]
    assert "ignoring unknown request field 'store'" in gateway.log()


def test_unknown_field_names_of_any_character_are_listed_escaped(gateway, model_id) -> None:
    """A control character or a non-ASCII letter in an unknown field's name (found by the
    fuzz test: the header value aborted the response) is listed escaped."""
    body = {"model": model_id, "prompt": "Hi", "max_tokens": 2, "\u001f": None, "é": 1}
    r = httpx.post(f"{gateway.base_url}/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert set(r.headers["x-uma-ignored-fields"].split(", ")) == {"\\x1f", "\\xe9"}


def test_sdk_sends_a_model_dump_message_and_extra_body(sdk, model_id) -> None:
    first = sdk.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Hi."}], max_tokens=4
    )
    again = sdk.chat.completions.create(
        model=model_id,
        messages=[
            {"role": "user", "content": "Hi."},
            first.choices[0].message.model_dump(),
            {"role": "user", "content": "And?"},
        ],
        max_tokens=4,
        store=False,
        metadata={"a": "b"},
        extra_body={"top_k": 20, "min_p": 0.1, "repetition_penalty": 1.1},
    )
    assert again.choices[0].finish_reason in ("stop", "length")


def test_wrong_type_of_a_known_field_stays_a_400(gateway, model_id) -> None:
    body = {**_dumped_chat(model_id), "temperature": "hot"}
    r = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "temperature"


def test_strict_fields_refuses_unknown_fields(strict_fields_gateway, model_id) -> None:
    body = _dumped_chat(model_id)
    r = httpx.post(f"{strict_fields_gateway.base_url}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert "Unrecognized request argument" in r.json()["error"]["message"]
    assert r.json()["error"]["param"]
