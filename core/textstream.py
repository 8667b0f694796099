"""Incremental detokenization with stop strings.

Token pieces are bytes; a UTF-8 character may span tokens, so undecodable tail bytes are
held until complete. Text that could be the start of a stop string is held back until it
either completes the stop (the generation ends there, the stop itself is never sent) or
cannot anymore, so no partial match ever leaks.
"""

from __future__ import annotations

import codecs


class TextStream:
    def __init__(self, stops: list[str] | None = None) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in (stops or []) if s]
        self._held = ""
        self.stopped = False

    def push(self, piece: bytes) -> str:
        """Add a token's bytes; return the text that is now safe to send ("" if none)."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(piece)
        if not self._stops:
            self._held = ""
            return text
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._partial_stop_len(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """End of generation: what is held is final text (a lone partial byte becomes U+FFFD)."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return text

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of some stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
