"""The checks of a generate request's chat extras (core/chat_extras.py): pure logic; through a
real umad: tests/integration/test_core_chat_extras.py."""

from __future__ import annotations

import pytest

from uma_serve.core import protocol as p
from uma_serve.core.chat_extras import problem

CHAT = [p.Message("user", "hi")]


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"prompt": "x", "chat_template_kwargs": {}}, "needs 'messages'"),
        ({"messages": CHAT, "chat_template_kwargs": {"messages": []}}, "cannot replace"),
        ({"messages": CHAT, "chat_template_kwargs": {"a": [{"b": "\x00"}]}}, "NUL"),
        ({"messages": CHAT, "chat_template_kwargs": {"a\x00": 1}}, "NUL"),
        ({"prompt": "x", "prefill": "b\x00"}, "'prefill' contains a NUL"),
    ],
)
def test_refused_extras_are_named(fields: dict, fragment: str) -> None:
    assert fragment in (problem(p.Generate(id="a", **fields)) or "")


def test_accepted_extras() -> None:
    deep: list = []
    for _ in range(5000):  # as deep as a frame may nest: no recursion
        deep = [deep]
    kwargs = {"enable_thinking": False, "deep": deep, "add_generation_prompt": True}
    assert problem(p.Generate(id="a", messages=CHAT, chat_template_kwargs=kwargs)) is None
    assert problem(p.Generate(id="a", prompt="x", prefill="The answer:")) is None
