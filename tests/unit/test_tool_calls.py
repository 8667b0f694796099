"""The tool-call parser on texts a model writes: a list cut by max_tokens, repeated calls, a
cut head; fed whole or a character at a time, it gives the same calls and no markup."""

from __future__ import annotations

import pytest

from uma_serve.gateway.tool_calls import ToolCallParser

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PARIS = [("get_weather", '{"city": "Paris"}')]
OTHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'


def _run(text: str, forced: bool, step: int) -> tuple[str, list[tuple[str, str]], list]:
    parser = ToolCallParser(forced=forced)
    deltas = []
    for i in range(0, len(text), step):
        deltas += parser.feed(text[i : i + step])
    deltas += parser.finish()
    content = "".join(d.get("content", "") for d in deltas)
    calls = [(c.name, c.arguments) for c in parser.complete_calls]
    return content, calls, deltas


@pytest.mark.parametrize("step", [1, 3, 1000])
@pytest.mark.parametrize("forced", [True, False])
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (CALL + "\n<tool_call>\n", PARIS),  # issue 36's case
        (CALL + '\n<tool_call>\n{"name": "get_weather", "argu', PARIS),
        (CALL + '\n<tool_call>\n{"name": "get_weather", "arguments": {"ci', PARIS),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"ci', []),
        ("<tool_call>\n{\"na", []),
        ("\n".join([CALL, CALL, OTHER, CALL]), [("get_weather", '{"city": "Paris"}'),
                                               ("get_weather", '{"city": "Rome"}')]),
    ],
)  # fmt: skip
def test_complete_distinct_calls_only_and_no_markup(text, expected, forced, step) -> None:
    content, calls, deltas = _run(text, forced, step)
    assert calls == expected
    assert "<tool" not in content and "name" not in content
    heads = [d["tool_calls"][0] for d in deltas if "id" in d.get("tool_calls", [{}])[0]]
    assert [h["index"] for h in heads] == list(range(len(expected)))
    for index, (_, args) in enumerate(expected):
        pieces = [d["tool_calls"][0]["function"]["arguments"] for d in deltas
                  if "tool_calls" in d and d["tool_calls"][0]["index"] == index]  # fmt: skip
        assert "".join(pieces) == args


def test_plain_text_in_auto_mode_is_content() -> None:
    assert _run("Hello <there>", forced=False, step=2)[:2] == ("Hello <there>", [])
    assert _run("<to", forced=False, step=1)[:2] == ("<to", [])
