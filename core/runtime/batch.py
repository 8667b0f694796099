"""The runtime's one reusable ``llama_batch``, filled from spans through numpy views on its
arrays: one slice assignment per span instead of a ctypes store per token."""

from __future__ import annotations

import llama_cpp as ll
import numpy as np

from uma_serve.core.runtime.gil import count
from uma_serve.core.runtime.params import Span


class DecodeBatch:
    def __init__(self, n: int, pad_id: int) -> None:
        """``n``: tokens at most; ``pad_id``: the sequence id of a lone token's companion
        (--deterministic), -1 for none."""
        self.batch = ll.llama_batch_init(n, 0, 1)
        self._tok = np.ctypeslib.as_array(self.batch.token, shape=(n,))
        self._pos = np.ctypeslib.as_array(self.batch.pos, shape=(n,))
        self.logits = np.ctypeslib.as_array(self.batch.logits, shape=(n,))  # output flags
        self._seq_ptrs = [self.batch.seq_id[i] for i in range(n)]
        np.ctypeslib.as_array(self.batch.n_seq_id, shape=(n,))[:] = 1
        self.pad_id = pad_id
        self.n_outputs = 0  # rows with an output in the last fill
        # every row of the last fill has an output (a tick of decodes alone): a row's place
        # among the outputs is the row itself
        self.dense = False

    def fill(self, spans: list[Span]) -> tuple[list[int], bool]:
        """The spans' tokens, in order: each span's first logits row (-1: none; a span with
        ``all_logits`` has its rows consecutive), and whether a pad token was added."""
        i = n_outputs = 0
        rows: list[int] = []
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
                n_outputs += n
            elif span.logits:
                self.logits[i - 1] = 1
                rows.append(i - 1)
                n_outputs += 1
            else:
                rows.append(-1)
        padded = i == 1 and self.pad_id >= 0
        if padded:  # deterministic: no decode of 1 token (it takes another attention kernel)
            self._tok[1], self._pos[1], self.logits[1] = self._tok[0], 0, 1
            self._seq_ptrs[1][0] = self.pad_id
            i = 2
            n_outputs += 1
        self.batch.n_tokens, self.n_outputs, self.dense = i, n_outputs, n_outputs == i
        return rows, padded

    def free(self) -> None:
        ll.llama_batch_free(self.batch)
