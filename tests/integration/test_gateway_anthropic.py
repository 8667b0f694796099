"""POST /v1/messages through the real anthropic SDK, the real gateway and umad serving the
instruct model: text, streamed events, a tool round trip, the x-api-key header."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from .gateway_helpers import Gateway, start_gateway

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}  # this SDK has no temperature argument; the API has the field


@pytest.fixture(scope="module")
def claude(chat_gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=chat_gateway.url, api_key="none", max_retries=0)


def test_text_with_system_and_blocks(claude, chat_model) -> None:
    m = claude.messages.create(
        model=chat_model,
        max_tokens=40,
        system=[{"type": "text", "text": "You are a helpful assistant.",
                 "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]}],
        extra_body=GREEDY,
    )  # fmt: skip
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0


def test_streamed_events(claude, chat_model) -> None:
    with claude.messages.stream(model=chat_model, max_tokens=30, messages=ASK,
                                extra_body=GREEDY) as stream:  # fmt: skip
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_delta" in kinds
    assert kinds[-2] == "message_delta" or "message_delta" in kinds
    whole = claude.messages.create(model=chat_model, max_tokens=30, messages=ASK, extra_body=GREEDY)
    assert final.content[0].text == whole.content[0].text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_tool_round_trip_streamed(claude, chat_model) -> None:
    kw = dict(model=chat_model, max_tokens=120, tools=[WEATHER], extra_body=GREEDY,
              tool_choice={"type": "any"})  # fmt: skip
    with claude.messages.stream(messages=ASK, **kw) as stream:
        first = stream.get_final_message()
    uses = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
    assert isinstance(uses[0].input, dict) and "city" in uses[0].input
    whole = claude.messages.create(messages=ASK, **kw)
    assert [(b.name, b.input) for b in whole.content if b.type == "tool_use"] == [
        (b.name, b.input) for b in uses
    ]
    follow = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": u.id, "content": "22 C and sunny"}
            for u in uses
        ]},
    ]  # fmt: skip
    with claude.messages.stream(model=chat_model, max_tokens=60, tools=[WEATHER],
                                messages=follow, extra_body=GREEDY) as stream:  # fmt: skip
        answer = stream.get_final_message()
    assert answer.content and answer.content[0].type == "text" and answer.content[0].text


@pytest.fixture(scope="module")
def keyed(chat_core) -> Iterator[Gateway]:
    gw = start_gateway(chat_core.socket, "--api-key", "sk-test")
    yield gw
    gw.stop()


def test_x_api_key_header_is_accepted(keyed, chat_model) -> None:
    good = anthropic.Anthropic(base_url=keyed.url, api_key="sk-test", max_retries=0)
    m = good.messages.create(model=chat_model, max_tokens=3, messages=ASK)
    assert m.usage.output_tokens > 0
    bad = anthropic.Anthropic(base_url=keyed.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model=chat_model, max_tokens=3, messages=ASK)
