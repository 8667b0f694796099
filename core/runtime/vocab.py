"""What the prompt tokenizer needs to know of the vocabulary: which bytes tokens never join.

llama.cpp's SPM tokenizer merges adjacent symbols only into vocabulary tokens. Two bytes that
never stand side by side inside any token's text can therefore never end up in one token: the
text on each side of them tokenizes exactly as it does within the whole (core/prompt_tokens.py).
"""

from __future__ import annotations

import re

import llama_cpp as ll
import numpy as np

_BYTE_TOKEN = re.compile(rb"<0x[0-9A-Fa-f]{2}>")
_SPACE = "\u2581".encode()  # SPM writes a space as U+2581 in token texts
_STRIPPING = ll.LLAMA_TOKEN_ATTR_LSTRIP | ll.LLAMA_TOKEN_ATTR_RSTRIP


def token_layout(vocab: ll.llama_vocab_p) -> tuple[np.ndarray, np.ndarray] | None:
    """(joined, lengths): ``joined[a, b]`` is True where byte b follows byte a inside some
    token's text; ``lengths[t]`` is the bytes token t stands for in a prompt (its text, spaces
    as spaces, a byte token one byte, a control token its own text as parse_special reads it).

    None where the argument above does not hold: a vocabulary other than SPM, or one with
    tokens that strip the whitespace around them.
    """
    if ll.llama_vocab_type(vocab) != ll.LLAMA_VOCAB_TYPE_SPM:
        return None
    n = ll.llama_vocab_n_tokens(vocab)
    get_attr, get_text = ll.llama_vocab_get_attr, ll.llama_vocab_get_text
    attrs = [get_attr(vocab, t) for t in range(n)]
    if any(a & _STRIPPING for a in attrs):
        return None
    texts = [get_text(vocab, t) or b"" for t in range(n)]
    for t, a in enumerate(attrs):
        if a & ll.LLAMA_TOKEN_ATTR_BYTE or _BYTE_TOKEN.fullmatch(texts[t]):
            texts[t] = b"\x00"  # one byte; no pair inside
    lengths = np.fromiter((len(x) - 2 * x.count(_SPACE) for x in texts), np.int64, count=n)
    buf = np.frombuffer(b"\x00".join(texts).replace(_SPACE, b" "), dtype=np.uint8)
    a, b = buf[:-1].astype(np.int64), buf[1:].astype(np.int64)
    joined = np.zeros(256 * 256, dtype=bool)
    joined[(a * 256 + b)[(a != 0) & (b != 0)]] = True  # not the separators nor byte tokens
    return joined.reshape(256, 256), lengths
