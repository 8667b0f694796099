"""The runtime's one reusable ``llama_batch``, filled from spans through numpy views on its
arrays: one slice assignment per span instead of a ctypes store per token."""

from __future__ import annotations

import llama_cpp as ll
import numpy as np

from uma_serve.core.runtime.gil import count
from uma_serve.core.runtime.params import Span


class DecodeBatch:
    def __init__(self, n: int, companion_id: int, pad: bool = False) -> None:
        """``n``: the spans' tokens at most. One token more may follow them: a companion, at
        position 0 of ``companion_id`` (a sequence without a device sampler; -1: none), its
        cell dropped after the decode. It pads a lone token (``pad``: --deterministic), and
        it joins a decode where a span wants its row's raw logits (``Span.raw_logits``):
        with one output lacking a device sampler, llama.cpp copies every row whole."""
        self.batch = ll.llama_batch_init(n + 1, 0, 1)
        self._tok = np.ctypeslib.as_array(self.batch.token, shape=(n + 1,))
        self._pos = np.ctypeslib.as_array(self.batch.pos, shape=(n + 1,))
        self.logits = np.ctypeslib.as_array(self.batch.logits, shape=(n + 1,))  # output flags
        self._seq_ptrs = [self.batch.seq_id[i] for i in range(n + 1)]
        np.ctypeslib.as_array(self.batch.n_seq_id, shape=(n + 1,))[:] = 1
        self.companion_id, self.pad = companion_id, pad

    def fill(self, spans: list[Span]) -> tuple[list[int], bool]:
        """The spans' tokens, in order: each span's first logits row (-1: none; a span with
        ``all_logits`` has its rows consecutive), and whether the companion was added."""
        i = 0
        rows: list[int] = []
        raw = False
        for span in spans:
            n = len(span.tokens)
            self._tok[i : i + n] = span.tokens
            self._pos[i : i + n] = count(n) + span.pos
            self.logits[i : i + n] = 0
            for ptr in self._seq_ptrs[i : i + n]:
                ptr[0] = span.seq_id
            i += n
            if span.all_logits:
                self.logits[i - n : i] = 1
                rows.append(i - n)
            elif span.logits:
                self.logits[i - 1] = 1
                rows.append(i - 1)
            else:
                rows.append(-1)
            raw |= span.raw_logits and (span.logits or span.all_logits)
        # deterministic: no decode of 1 token (it takes another attention kernel)
        companion = self.companion_id >= 0 and (raw or (i == 1 and self.pad))
        if companion:
            self._tok[i], self._pos[i], self.logits[i] = self._tok[0], 0, 1
            self._seq_ptrs[i][0] = self.companion_id
            i += 1
        self.batch.n_tokens = i
        return rows, companion

    def free(self) -> None:
        ll.llama_batch_free(self.batch)
