"""chat_template_kwargs through the real gateway and core: more variables for the served
model's own chat template (SmolLM2-135M-Instruct's ChatML template reads
``add_generation_prompt``), as vLLM and llama-server take them; a value that is not an object
is a 400 naming the field."""

from __future__ import annotations

import httpx
import openai
import pytest

CHAT = [{"role": "user", "content": "Say hi."}]


def _prompt_tokens(client: openai.OpenAI, model: str, **extra) -> int:
    r = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=1, temperature=0, extra_body=extra or None
    )
    return r.usage.prompt_tokens


def test_kwargs_reach_the_models_template(chat_gateway, chat_model) -> None:
    """add_generation_prompt false leaves out the template's assistant header: the prompt is
    shorter by exactly that header's tokens."""
    client = chat_gateway.client()
    whole = _prompt_tokens(client, chat_model)
    cut = _prompt_tokens(client, chat_model, chat_template_kwargs={"add_generation_prompt": False})
    header = httpx.post(
        f"{chat_gateway.url}/tokenize", json={"content": "<|im_start|>assistant\n"}, timeout=30
    ).json()["tokens"]
    assert len(header) >= 2
    assert whole - cut == len(header)
    # a variable this template does not read changes nothing, and is not "ignored"
    r = httpx.post(
        f"{chat_gateway.base_url}/chat/completions",
        json={"model": chat_model, "messages": CHAT, "max_tokens": 1,
              "chat_template_kwargs": {"enable_thinking": False}},
        timeout=60,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert "x-uma-ignored-fields" not in r.headers
    assert r.json()["usage"]["prompt_tokens"] == whole


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ("enable_thinking", "chat_template_kwargs"),
        ([{"enable_thinking": False}], "chat_template_kwargs"),
        ({"messages": []}, "chat_template_kwargs.messages"),
        ({"x": "a\u0000b"}, "chat_template_kwargs"),
    ],
)
def test_bad_kwargs_are_a_400_naming_the_field(chat_gateway, chat_model, value, param) -> None:
    client = chat_gateway.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=chat_model, messages=CHAT, max_tokens=1,
            extra_body={"chat_template_kwargs": value},
        )  # fmt: skip
    assert err.value.param == param
    assert _prompt_tokens(client, chat_model) > 0  # and the next request is served
