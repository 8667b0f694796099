"""A forced tool call's fixed start is put in the prompt, not sampled (docs/GATEWAY.md, "Tool
calls"): through the real openai SDK, gateway and the instruct model. The prompt ends with the
call's opening tag and, with one function, its name; the answer is read from there, the same
calls streamed and whole, and usage counts those tokens as the prompt's."""

from __future__ import annotations

import json

import httpx
import pytest

from uma_serve.gateway.gbnf import call_prefix

from .test_gateway_tool_limits import WEATHER, _assembled, _calls

TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _tokens(gateway, text: str) -> int:
    r = httpx.post(
        f"{gateway.url}/tokenize", json={"content": text, "parse_special": False}, timeout=30
    )
    return len(r.json()["tokens"])


def _both(sdk, **kw):
    """The whole answer and the streamed one (content, calls, reason, usage)."""
    whole = sdk.chat.completions.create(**kw)
    chunks = list(
        sdk.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    usage = chunks[-1].usage
    return whole, _assembled([c for c in chunks if c.choices]), usage


def test_a_named_call_samples_only_its_arguments(chat_gateway, chat_model) -> None:
    sdk = chat_gateway.client()
    kw = dict(model=chat_model, messages=ASK, tools=[WEATHER], max_tokens=60, temperature=0)
    whole, (content, calls, reason), usage = _both(sdk, tool_choice=NAMED, **kw)
    choice = whole.choices[0]
    assert calls == _calls(choice.message) and len(calls) == 1
    assert calls[0][0] == "get_weather" and isinstance(json.loads(calls[0][1]), dict)
    assert content is None and choice.message.content is None
    assert choice.finish_reason == reason == "tool_calls"
    assert usage.completion_tokens == whole.usage.completion_tokens
    head = _tokens(chat_gateway, call_prefix([{"name": "get_weather"}]))
    # the head is the prompt's: the same messages without a forced call are shorter by it
    auto = sdk.chat.completions.create(tool_choice="auto", **kw)
    assert whole.usage.prompt_tokens - auto.usage.prompt_tokens == head
    # sampled: the arguments (and the end), fewer tokens than the fixed head alone
    assert whole.usage.completion_tokens < head


@pytest.mark.parametrize("parallel", [False, True])
def test_required_with_several_functions(chat_gateway, chat_model, parallel) -> None:
    """The prompt ends inside the call's name; the grammar picks among the functions."""
    sdk = chat_gateway.client()
    kw = dict(model=chat_model, messages=ASK, tools=[TIME, WEATHER], tool_choice="required",
              parallel_tool_calls=parallel, max_tokens=120, temperature=0)  # fmt: skip
    whole, (content, calls, reason), usage = _both(sdk, **kw)
    choice = whole.choices[0]
    assert calls == _calls(choice.message) and calls
    assert all(n in ("get_time", "get_weather") for n, _ in calls)
    assert content is None and choice.message.content is None
    assert choice.finish_reason == reason
    assert usage.completion_tokens == whole.usage.completion_tokens
    if not parallel:
        assert len(calls) == 1 and reason == "tool_calls"


def test_required_with_one_function_and_parallel_calls(chat_gateway, chat_model) -> None:
    """The first call's head is given, the next calls are sampled whole: the same calls in
    both modes, none cut into content."""
    sdk = chat_gateway.client()
    ask = [{"role": "user", "content": "Weather in Paris and Rome?"}]
    kw = dict(model=chat_model, messages=ask, tools=[WEATHER], tool_choice="required",
              max_tokens=120, temperature=0)  # fmt: skip
    whole, (content, calls, reason), _ = _both(sdk, **kw)
    choice = whole.choices[0]
    assert calls == _calls(choice.message) and calls
    assert content is None and choice.message.content is None
    assert choice.finish_reason == reason
