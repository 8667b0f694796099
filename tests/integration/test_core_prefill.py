"""The core's ``prefill`` (docs/PROTOCOL.md) through a real umad: the prompt ends with it, as
plain text after the chat template's generation prompt, it is not sent back, and its tokens
count as the prompt's."""

from __future__ import annotations

from uma_serve.clients.client import new_id
from uma_serve.core import protocol as p

from .helpers import gen


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
