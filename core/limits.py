"""The limits a generate request is held to, defined once: the core refuses a request over
them (any socket client's), and the gateway checks the same before it sends one, so that its
client gets the answer without a round trip and with the request's own field named.

The numbers are the core's options (``--max-tokens``, ``--max-prompt-bytes``) and the model's
vocabulary, which a client reads from ``info``.
"""

from __future__ import annotations

from typing import NamedTuple

from uma_serve.core import protocol as p


class Refusal(NamedTuple):
    """Why a request is over a limit: its error code, the message, and the field at fault:
    ``max_tokens``, ``logit_bias`` or ``prompt`` (the prompt, or the messages' contents)."""

    code: str
    message: str
    field: str


def prompt_bytes(req: p.Generate) -> int:
    """What ``--max-prompt-bytes`` counts: the prompt's UTF-8 bytes, or the messages', and
    the prefill's (the answer's given start, which the prompt ends with)."""
    prefill = len((req.prefill or "").encode())
    if req.messages is not None:
        return sum(len(m.content.encode()) for m in req.messages) + prefill
    return len((req.prompt or "").encode()) + prefill


def over_prompt_bytes(size: int, limit: int) -> Refusal | None:
    """A text of ``size`` bytes to tokenize (a prompt, /tokenize's content) over ``limit``."""
    if size <= limit:
        return None
    return Refusal(p.E_LIMIT, f"prompt of {size} bytes is over max_prompt_bytes {limit}", "prompt")


def over_limits(
    req: p.Generate, max_tokens: int, max_prompt_bytes: int, n_vocab: int
) -> Refusal | None:
    """The first limit ``req`` is over, or None."""
    if req.max_tokens > max_tokens:
        message = f"max_tokens {req.max_tokens} is over the limit {max_tokens}"
        return Refusal(p.E_LIMIT_TOKENS, message, "max_tokens")
    if req.logit_bias and (top := max(req.logit_bias)) >= n_vocab:
        message = f"logit_bias token id {top} is not in the vocabulary (0..{n_vocab - 1})"
        return Refusal(p.E_PROTO, message, "logit_bias")
    return over_prompt_bytes(prompt_bytes(req), max_prompt_bytes)
