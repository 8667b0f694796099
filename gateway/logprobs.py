"""The core's per-token log-probabilities in OpenAI's two shapes."""

from __future__ import annotations

from typing import Any

from uma_serve.core import protocol as p


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")  # a piece may hold part of a character


def _entry(t: p.TokenLogprob) -> dict[str, Any]:
    return {"token": _text(t.piece), "logprob": t.logprob, "bytes": list(t.piece)}


def chat_logprobs(lps: list[p.Logprobs]) -> dict[str, Any]:
    """Chat completions: ``content`` entries with the token's bytes and its alternatives."""
    content = [{**_entry(x.token), "top_logprobs": [_entry(t) for t in x.top]} for x in lps]
    return {"content": content, "refusal": None}


def text_logprobs(lps: list[p.Logprobs], offset: int) -> tuple[dict[str, Any], int]:
    """The completions API's parallel lists, ``text_offset`` counted from ``offset`` (the
    choice's text so far); returns the block and the offset after these tokens."""
    tokens, offsets = [], []
    for x in lps:
        tokens.append(_text(x.token.piece))
        offsets.append(offset)
        offset += len(tokens[-1])
    block = {
        "tokens": tokens,
        "token_logprobs": [x.token.logprob for x in lps],
        "top_logprobs": [{_text(t.piece): t.logprob for t in x.top} for x in lps],
        "text_offset": offsets,
    }
    return block, offset
