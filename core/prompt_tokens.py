"""Prompt tokenization that reuses the tokens of a recent prompt with the same beginning.

A long shared beginning (a system prompt, an agent's growing transcript) would otherwise be
tokenized again by every request: 7 ms for 1,500 tokens on the 2-core CPU, most of what a warm
request costs beyond its question on the GPU, and ~150 ms a turn for a 30,000-token transcript.

Exact, not approximate: llama.cpp's SPM tokenizer merges adjacent symbols only into vocabulary
tokens, so at a *hard* boundary (two bytes that never stand side by side inside any token's
text: in Gemma's vocabulary a newline next to anything else, a letter before a space) no token
can span, and the text on each side tokenizes as it does within the whole. A new prompt takes a
recent prompt's tokens up to the last hard boundary inside their common beginning and has
llama.cpp tokenize only the rest. Vocabularies where that argument fails (not SPM, tokens that
strip whitespace, a prefix space on every text, specials other than a leading BOS) tokenize
every prompt whole; a probe at start-up checks the last three.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict

import numpy as np

from uma_serve.core.runtime import Runtime
from uma_serve.core.runtime.vocab import token_layout

CHAT_CACHE_BYTES = 1 << 21  # chat parts whose tokens are remembered, in characters at most
MIN_REUSE_BYTES = 1024  # a shorter common beginning is not worth the bookkeeping
RECENT = 8  # prompts remembered
MAX_STEPS = 256  # tokens walked back from the end of the common beginning to a hard boundary
_PROBE = ("Alpha beta, gamma.\n\n", "Delta <start_of_turn>epsilon\nzeta")
# SPM reads a space and U+2581 alike, so a prompt holding U+2581 would throw the byte offsets off
_SPACE_MARK = "\u2581"


def common_prefix_len(a: bytes, b: bytes) -> int:
    """Bytes a and b share from their start (binary search over memcmp, no copies)."""
    ma, mb = memoryview(a), memoryview(b)
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ma[lo:mid] == mb[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PromptTokenizer:
    """``tokenize(text)`` equals ``runtime.tokenize(text)``, faster for a shared beginning.
    One thread only (the daemon's I/O thread)."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._specials = runtime.tokenize("", True)  # what add_special puts first (a BOS)
        layout = token_layout(runtime.vocab)
        self._joined, self._lengths = layout if layout else (None, None)
        # prompt bytes -> (tokens without the specials, byte offset where each token ends)
        self._recent: OrderedDict[bytes, tuple[list[int], list[int]]] = OrderedDict()
        self.reused_tokens_total = 0
        self.enabled = layout is not None and self._probe()

    def _probe(self) -> bool:
        left, right = _PROBE
        whole = self._rt.tokenize(left + right, False)
        return (
            self._rt.tokenize(left + right, True) == self._specials + whole
            and self._rt.tokenize(left, False) + self._rt.tokenize(right, False) == whole
        )

    def clear(self) -> None:
        """Forget the remembered prompts."""
        self._recent.clear()

    def tokenize(self, text: str) -> list[int]:
        if not self.enabled or _SPACE_MARK in text:
            return self._rt.tokenize(text)
        data = text.encode("utf-8")
        if len(data) < MIN_REUSE_BYTES:  # too short to remember or to reuse
            return self._rt.tokenize(text)
        reused = self._reuse(data)
        if reused is None:
            tokens = self._rt.tokenize(text, False)
            ends = self._ends(tokens, 0)
        else:
            tokens, ends = reused
        if ends and ends[-1] == len(data):
            self._recent[data] = (tokens, ends)
            self._recent.move_to_end(data)
            while len(self._recent) > RECENT:
                self._recent.popitem(last=False)
        return self._specials + tokens

    def _ends(self, tokens: list[int], start: int) -> list[int]:
        assert self._lengths is not None
        return (start + np.cumsum(self._lengths[tokens])).tolist() if tokens else []

    def _reuse(self, data: bytes) -> tuple[list[int], list[int]] | None:
        if not self._recent:
            return None
        common, best = max((common_prefix_len(data, key), key) for key in self._recent)
        if common < MIN_REUSE_BYTES:
            return None
        tokens, ends = self._recent[best]
        self._recent.move_to_end(best)
        joined = self._joined
        assert joined is not None
        # keep tokens[:k], which end at byte b = ends[k - 1]; b < common, so the byte after
        # it is the same in both prompts, and the boundary must be hard in both
        last = bisect_right(ends, common - 1)
        for k in range(last, max(last - MAX_STEPS, 0), -1):
            b = ends[k - 1]
            if b > 0 and data[b] & 0xC0 != 0x80 and not joined[data[b - 1], data[b]]:
                tail = self._rt.tokenize(data[b:].decode("utf-8"), False)
                self.reused_tokens_total += k
                return tokens[:k] + tail, ends[:k] + self._ends(tail, b)
        return None


class ChatTokenizer:
    """A chat prompt's tokens from its parts (``ChatTemplate.render_parts``): the template's
    markup with special tokens parsed, each message's content as plain text, so content
    cannot forge a turn. A transcript's earlier messages come back every turn: each part's
    tokens are remembered (LRU, bounded in text bytes), so a turn tokenizes mostly its new
    messages. One thread only (the daemon's I/O thread)."""

    def __init__(self, runtime: Runtime, max_bytes: int = CHAT_CACHE_BYTES) -> None:
        self._rt = runtime
        self._specials = runtime.tokenize("", True)  # what add_special puts first (a BOS)
        self._max_bytes = max_bytes
        self._bytes = 0
        self._cache: OrderedDict[tuple[str, bool], list[int]] = OrderedDict()

    def tokenize(self, parts: list[tuple[str, bool]]) -> list[int]:
        tokens = list(self._specials)
        for part in parts:
            cached = self._cache.get(part)
            if cached is not None:
                self._cache.move_to_end(part)
                tokens += cached
                continue
            text, markup = part
            piece = self._rt.tokenize(text, False, special=markup)
            tokens += piece
            if len(text) <= self._max_bytes // 4:
                self._cache[part] = piece
                self._bytes += len(text)
                while self._bytes > self._max_bytes:
                    (old, _), _ = self._cache.popitem(last=False)
                    self._bytes -= len(old)
        return tokens
