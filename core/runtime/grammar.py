"""A request's grammar (GBNF, llama.cpp's grammar sampler): which tokens it allows next.

llama.cpp's grammar sampler checks a candidate token by matching its text against the
grammar's parse stacks: ~0.3 us a token, so masking the whole 262,144-token row costs
50-100 ms here, far more than a tick. As llama.cpp's common sampler does, the token is first
drawn without the grammar and kept when the grammar accepts it (one check); only otherwise is
the row masked, and then only as far as needed: the row's best tokens in growing bands below
its peak (4, 8, 12, 16, 24 logits, then all) until ``top_k`` of them pass (greedy: one), so
the top-k of the allowed tokens is what a whole-row mask would give, or until those not checked are
all too unlikely to be drawn (under the best allowed token's by min-p's ratio, or together
under 1e-4 of it without min-p): without that, a grammar allowing fewer than ``top_k``
tokens (a quote, a brace) scans the whole row at every such step. The chain itself (bias,
penalties, top-k / top-p / min-p, temperature, the draw) is core/sampling.py's, for every row.
"""

from __future__ import annotations

import ctypes
import json
import math
from typing import TYPE_CHECKING

import llama_cpp as ll
import numpy as np

from uma_serve.core.runtime.gil import held
from uma_serve.core.runtime.grammar_limits import shape_error

if TYPE_CHECKING:
    from uma_serve.core.protocol import Sampling

BANDS = (4.0, 8.0, 12.0, 16.0, 24.0)  # logits below the row's peak, checked band by band
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


class GrammarError(ValueError):
    """The GBNF text does not parse (llama.cpp logs the reason)."""


def parse_grammar(vocab: ll.llama_vocab_p, text: str) -> ll.llama_sampler_p:
    """A llama.cpp grammar sampler for ``text`` (root rule ``root``), or GrammarError (also
    for a grammar too deep for llama.cpp's recursive parser: core/runtime/grammar_limits.py)."""
    problem = shape_error(text)
    if problem is not None:
        raise GrammarError(problem)
    sampler = ll.llama_sampler_init_grammar(vocab, text.encode(), b"root")
    if not sampler:
        raise GrammarError("the grammar does not parse as GBNF with a 'root' rule")
    return sampler


def json_schema_gbnf(schema: dict) -> str:
    """GBNF for a JSON schema by llama-cpp-python's converter, as the gateway builds it (for
    tools such as the bench; the gateway converts without loading libllama, gateway/gbnf.py):
    JSON strings may not hold raw control characters, which the converter's ``char`` allows
    and JSON parsers refuse."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return json_schema_to_gbnf(json.dumps(schema)).replace(_CHAR, _JSON_CHAR)


def check_grammar(vocab: ll.llama_vocab_p, text: str) -> None:
    ll.llama_sampler_free(parse_grammar(vocab, text))


class FirstChars:
    """Each token's first byte, and a token that is just that byte: a band's tokens whose
    first byte the grammar refuses are ruled out without llama.cpp's check, which walks each
    token's text (0.2 us a token: most of a search that goes deep, where the grammar allows
    a quote the model ranks 16 logits below its peak and 160,000 tokens lie above that). A
    lone UTF-8 lead byte passes the check where a character it begins may follow. Built once
    per vocabulary (Gemma 3's 262,144 texts: 0.39 s on the 2-core CPU; SmolLM2's 49,152:
    0.08 s): umad does it at start-up."""

    EMPTY, EOG = 256, 257  # no text: llama.cpp's grammar refuses it; an EOG: not by its text

    def __init__(self, vocab: ll.llama_vocab_p) -> None:
        n = ll.llama_vocab_n_tokens(vocab)
        self.first = np.full(n, self.EMPTY, dtype=np.int16)
        self.single = np.full(256, -1, dtype=np.int64)  # a token that is that one byte
        buf = ctypes.create_string_buffer(256)
        # quick calls that keep the GIL (gil.py): the loop runs 262,144 times
        to_piece, is_eog = held(ll.llama_token_to_piece), held(ll.llama_vocab_is_eog)
        for t in range(n):  # as llama.cpp's grammar reads a token: its text, special too
            k = to_piece(vocab, t, buf, 256, 0, True)
            if k < 0:
                buf = ctypes.create_string_buffer(-k)
                k = to_piece(vocab, t, buf, -k, 0, True)
            if is_eog(vocab, t):
                self.first[t] = self.EOG
            elif k > 0:
                byte = self.first[t] = buf[0][0]
                if k == 1 and self.single[byte] < 0:
                    self.single[byte] = t


class Grammar:
    """One sequence's grammar: the chain (core/sampling.py) asks it whether its drawn token is
    allowed and, when not, for the allowed candidates of the row."""

    def __init__(
        self,
        vocab: ll.llama_vocab_p,
        text: str,
        eog: tuple[int, ...] = (),
        first_chars: FirstChars | None = None,
    ) -> None:
        self._grammar: ll.llama_sampler_p | None = parse_grammar(vocab, text)
        # end-of-generation tokens are always checked first: once the grammar is complete
        # they are all it allows, and they are rarely among the row's best
        self._eog = np.array(eog, dtype=np.int64)
        self._first_chars = first_chars

    def free(self) -> None:
        if self._grammar is not None:
            ll.llama_sampler_free(self._grammar)
            self._grammar = None

    def __del__(self) -> None:
        self.free()

    def accept(self, token: int) -> None:
        ll.llama_sampler_accept(self._grammar, token)

    def allows(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """The grammar's verdict on candidates: a bool mask of the allowed ones."""
        data = np.empty(len(ids), dtype=_TOKEN_DATA)
        data["id"], data["logit"], data["p"] = ids, logits, 0.0
        arr = ll.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)),
            size=len(ids),
            selected=-1,
            sorted=False,
        )
        ll.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        return np.isfinite(data["logit"])

    def allowed(self, logits: np.ndarray, p: Sampling) -> tuple[np.ndarray, np.ndarray]:
        """The allowed candidates among the row's best, in growing bands below its peak,
        until the band holds ``top_k`` allowed tokens (greedy: one; no top-k: the whole row),
        so they hold the allowed top-k exactly. EOG tokens are checked with the first band.
        A band is one comparison over the row (an exact top-n would be a partition of it:
        ten times the cost, and most of a constrained token's); of its tokens, only those
        whose first byte the grammar may allow now are checked (FirstChars)."""
        n = len(logits)
        need = 1 if p.temperature <= 0.0 else p.top_k if p.top_k > 0 else n
        # below the best allowed token by more than this, a token cannot be drawn: min-p would
        # drop it; without min-p, all the unchecked tokens together would hold under 1e-4 of
        # the best one's probability
        temp = max(p.temperature, 1e-6)
        cut = math.log(p.min_p) if p.min_p > 0.0 else temp * math.log(1e-4 / n)
        peak = float(logits.max())
        ok: list[np.ndarray] = []
        cands, above = self._eog, math.inf
        starts = None  # which first bytes the grammar allows now
        for gap in (*BANDS, math.inf):
            floor = peak - gap  # every unchecked token is below it
            band = np.flatnonzero((logits >= floor) & (logits < above))  # the new ones
            band = band[~np.isin(band, self._eog)]
            if self._first_chars is not None:
                starts = self._starts() if starts is None else starts
                band = band[starts[self._first_chars.first[band]]]
            cands = np.concatenate([cands, band])
            ok.append(cands[self.allows(cands, logits[cands])])
            allowed = np.concatenate(ok)
            if gap == math.inf or int((logits[allowed] >= floor).sum()) >= need:
                break
            if len(allowed) and floor < float(logits[allowed].max()) + cut:
                break  # the unchecked tokens are all too unlikely to be drawn
            cands, above = np.empty(0, dtype=np.int64), floor
        if not len(allowed):  # nothing allowed: a broken grammar
            raise GrammarError("the grammar allows no token here")
        return allowed, logits[allowed]

    def _starts(self) -> np.ndarray:
        """Whether a token with each first byte (FirstChars.first) may be allowed now: one
        check of the one-byte tokens (a byte without one: maybe)."""
        fc = self._first_chars
        assert fc is not None
        starts = np.ones(FirstChars.EOG + 1, dtype=bool)
        starts[FirstChars.EMPTY] = False
        have = np.flatnonzero(fc.single >= 0)
        starts[have] = self.allows(fc.single[have], np.zeros(len(have), np.float32))
        return starts
