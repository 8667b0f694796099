"""The core's chat extras (docs/PROTOCOL.md) through a real umad: ``prefill`` ends the prompt,
as plain text after the chat template's generation prompt, it is not sent back, and its
tokens count as the prompt's; refused extras (``chat_template_kwargs`` without messages or
replacing them, a NUL) are ``E_PROTO_001`` and the connection goes on."""

from __future__ import annotations

import json

import pytest

from uma_serve.clients.client import new_id
from uma_serve.core import protocol as p

from .helpers import frame, gen, raw_socket, read_event


def _usage(umad, request: p.Generate) -> p.Usage:
    with umad.client() as c:
        return c.complete(request).usage


def _tokens(umad, text: str, special: bool) -> int:
    with umad.client() as c:
        return len(c.tokenize(text, parse_special=special).tokens)


def test_prefill_ends_a_prompt(umad) -> None:
    whole = _usage(umad, gen("The capital of France is", stream=False))
    given = _usage(umad, gen("The capital of France", prefill=" is", stream=False))
    assert given.prompt_tokens == whole.prompt_tokens


def test_prefill_follows_the_generation_prompt_as_plain_text(umad) -> None:
    """After the template's turn header, the prefill's tokens are plain text: its
    "<end_of_turn>" is not Gemma's control token."""
    chat = [p.Message("user", "Hi.")]
    plain = _usage(umad, p.Generate(id=new_id(), messages=chat, max_tokens=2, stream=False))
    text = "Sure<end_of_turn>"
    given = _usage(
        umad, p.Generate(id=new_id(), messages=chat, max_tokens=2, stream=False, prefill=text)
    )
    assert given.prompt_tokens - plain.prompt_tokens == _tokens(umad, text, special=False)
    assert _tokens(umad, text, special=False) > _tokens(umad, text, special=True)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"prompt": "x", "chat_template_kwargs": {"a": 1}}, "needs 'messages'"),
        ({"messages": [{"role": "user", "content": "y"}], "chat_template_kwargs": {"messages": 1}},
         "cannot replace"),
        ({"prompt": "x", "prefill": "b\u0000"}, "'prefill' contains a NUL"),
    ],
)  # fmt: skip
def test_refused_extras_are_e_proto_and_the_connection_serves_on(umad, fields, fragment) -> None:
    s = raw_socket(umad.socket)
    try:
        s.sendall(frame(json.dumps({"id": "bad", **fields}).encode()))
        ev = read_event(s)
        assert isinstance(ev, p.ErrorEvent) and ev.code == p.E_PROTO and ev.id == "bad"
        assert fragment in ev.message
        s.sendall(frame(json.dumps({"id": "ok", "prompt": "Hi", "max_tokens": 2,
                                    "stream": False}).encode()))  # fmt: skip
        assert isinstance(read_event(s), p.CompletionEvent)
    finally:
        s.close()
