"""Tool calls cut by max_tokens (issue 36): through the real openai SDK, gateway and the
instruct model, at max_tokens 25, 40 and 120, streamed and not: the complete calls are
tool_calls, the cut one is dropped, no markup reaches content, both modes agree, and no call
repeats an identical earlier one."""

from __future__ import annotations

import json

import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris, Rome and Oslo?"}]
MARKUP = ("<tool_call", "</tool_call", '"arguments"')


def _calls(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def _assembled(chunks) -> tuple[str | None, list[tuple[str, str]], str]:
    """A stream's content, calls (by index, as the SDK assembles them) and finish reason (the
    SDK's own helper refuses to assemble an answer that ended on the length limit)."""
    content, calls, reason = "", {}, None
    for ch in chunks:
        c = ch.choices[0]
        content += c.delta.content or ""
        for d in c.delta.tool_calls or []:
            name, args = calls.get(d.index, ("", ""))
            calls[d.index] = (d.function.name or name, args + (d.function.arguments or ""))
        reason = c.finish_reason or reason
    return content or None, [calls[i] for i in sorted(calls)], reason


@pytest.mark.parametrize("choice", ["required", "auto"])
@pytest.mark.parametrize("max_tokens", [25, 40, 120])
def test_cut_call_lists(chat_gateway, chat_model, max_tokens, choice) -> None:
    sdk = chat_gateway.client()
    kw = dict(model=chat_model, messages=ASK, tools=[WEATHER], tool_choice=choice,
              max_tokens=max_tokens, temperature=0)  # fmt: skip
    whole = sdk.chat.completions.create(**kw).choices[0]
    content, calls, reason = _assembled(sdk.chat.completions.create(**kw, stream=True))
    for text, made in ((whole.message.content, _calls(whole.message)), (content, calls)):
        assert not any(m in (text or "") for m in MARKUP), text
        assert len(set(made)) == len(made)  # no identical repeats
        for _, args in made:
            json.loads(args)
    assert _calls(whole.message) == calls
    assert whole.finish_reason == reason
    assert (whole.message.content or None) == content
    if choice == "required" and max_tokens >= 40:
        assert calls, "a 40-token budget holds one complete call"
