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
tokens (a quote, a brace) scans the whole row at every such step. On a GPU the row is the
device's best GRAMMAR_TOP_K tokens (core/sampling.py), searched the same way. The chain
itself (bias, penalties, top-k / top-p / min-p, temperature, the draw) is core/sampling.py's,
for every row.
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
# a band's tokens from which those whose first byte the grammar refuses are ruled out first
# (FirstChars: a check of the 256 one-byte tokens); fewer are checked as they are
FILTER_FROM = 256
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
_apply = held(ll.llama_sampler_apply)


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
        # a token that is that one byte: a piece of the vocabulary's own rather than its
        # byte-fallback token (<0x22> beside '"'), which models rank far below it
        self.single = np.full(256, -1, dtype=np.int64)
        buf = ctypes.create_string_buffer(256)
        # quick calls that keep the GIL (gil.py): the loop runs 262,144 times
        to_piece, is_eog = held(ll.llama_token_to_piece), held(ll.llama_vocab_is_eog)
        attr, BYTE = held(ll.llama_vocab_get_attr), ll.LLAMA_TOKEN_ATTR_BYTE
        for t in range(n):  # as llama.cpp's grammar reads a token: its text, special too
            k = to_piece(vocab, t, buf, 256, 0, True)
            if k < 0:
                buf = ctypes.create_string_buffer(-k)
                k = to_piece(vocab, t, buf, -k, 0, True)
            if is_eog(vocab, t):
                self.first[t] = self.EOG
            elif k > 0:
                byte = self.first[t] = buf[0][0]
                if k == 1 and (self.single[byte] < 0 or attr(vocab, self.single[byte]) & BYTE):
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
        self._one = ll.llama_token_data()  # the drawn token's check (allows_one)
        self._one_row = ll.llama_token_data_array(
            data=ctypes.pointer(self._one), size=1, selected=-1, sorted=False
        )
        self._one_ref = ctypes.byref(self._one_row)
        self._data = np.zeros(0, dtype=_TOKEN_DATA)
        self._row = ll.llama_token_data_array(selected=-1, sorted=False)
        self._row_ref = ctypes.byref(self._row)

    def free(self) -> None:
        if self._grammar is not None:
            ll.llama_sampler_free(self._grammar)
            self._grammar = None

    def __del__(self) -> None:
        self.free()

    def accept(self, token: int) -> None:
        ll.llama_sampler_accept(self._grammar, token)

    def allows_one(self, token: int) -> bool:
        """Whether the grammar allows ``token`` now: the drawn token's check, with the GIL
        held (a check of one token takes a few us; gil.py) and no arrays made."""
        self._one.id, self._one.logit, self._one_row.size = token, 0.0, 1
        _apply(self._grammar, self._one_ref)
        return math.isfinite(self._one.logit)

    def allows(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """The grammar's verdict on candidates: a bool mask of the allowed ones. Up to
        FILTER_FROM tokens the check keeps the GIL (gil.py: ~0.1 us a token)."""
        n = len(ids)
        if len(self._data) < n:  # the array llama.cpp reads, kept for the next checks
            self._data = np.zeros(max(n, 2 * len(self._data)), dtype=_TOKEN_DATA)
            self._row.data = self._data.ctypes.data_as(ctypes.POINTER(ll.llama_token_data))
        data = self._data[:n]
        data["id"], data["logit"] = ids, logits
        self._row.size, self._row.selected = n, -1
        (_apply if n <= FILTER_FROM else ll.llama_sampler_apply)(self._grammar, self._row_ref)
        return np.isfinite(data["logit"])

    def allowed(
        self, logits: np.ndarray, p: Sampling, ids: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The allowed candidates among the row's best, in growing bands below its peak,
        until the band holds ``top_k`` allowed tokens (greedy: one; no top-k: the whole row),
        so they hold the allowed top-k exactly. EOG tokens are checked with the first band.
        A band is one comparison over the row (an exact top-n would be a partition of it:
        ten times the cost, and most of a constrained token's); of its tokens, only those
        whose first byte the grammar may allow now are checked (FirstChars).

        ``ids``: the row is only the device's best tokens (``logits[i]`` is token
        ``ids[i]``'s). Where those settle the search, the result is the whole row's; where
        they do not, it is the allowed tokens among them; where none is allowed, the allowed
        end-of-generation token, else the allowed one-byte token of the lowest byte (the
        model ranks none of them: each lies below every candidate)."""
        fc = self._first_chars  # a row of candidates: the vocabulary's size, where known
        n = len(logits) if ids is None or fc is None else len(fc.first)
        need = 1 if p.temperature <= 0.0 else p.top_k if p.top_k > 0 else n
        # below the best allowed token by more than this, a token cannot be drawn: min-p would
        # drop it; without min-p, all the unchecked tokens together would hold under 1e-4 of
        # the best one's probability
        temp = max(p.temperature, 1e-6)
        cut = math.log(p.min_p) if p.min_p > 0.0 else temp * math.log(1e-4 / n)
        peak = float(logits.max())
        ok: list[np.ndarray] = []
        # positions in the row; EOG tokens first, where the row has them
        cands, above = self._eog_positions(ids), math.inf
        starts = None  # which first bytes the grammar allows now
        for gap in (*BANDS, math.inf):
            floor = peak - gap  # every unchecked token is below it
            band = np.flatnonzero((logits >= floor) & (logits < above))  # the new ones
            tokens = band if ids is None else ids[band]
            if self._first_chars is None:
                keep = ~np.isin(tokens, self._eog)
            elif starts is not None or len(band) > FILTER_FROM:
                starts = self._starts() if starts is None else starts
                keep = starts[self._first_chars.first[tokens]]  # (never an EOG: checked apart)
            else:
                keep = self._first_chars.first[tokens] != FirstChars.EOG
            cands = np.concatenate([cands, band[keep]])
            of = cands if ids is None else ids[cands]
            ok.append(cands[self.allows(of, logits[cands])])
            allowed = np.concatenate(ok)
            if gap == math.inf or int((logits[allowed] >= floor).sum()) >= need:
                break
            if len(allowed) and floor < float(logits[allowed].max()) + cut:
                break  # the unchecked tokens are all too unlikely to be drawn
            cands, above = np.empty(0, dtype=np.int64), floor
        if ids is not None:
            if not len(allowed):
                token = self._unranked()
                return np.array([token]), np.array([float(logits.min())], dtype=np.float32)
            return ids[allowed], logits[allowed]
        if not len(allowed):  # nothing allowed: a broken grammar
            raise GrammarError("the grammar allows no token here")
        return allowed, logits[allowed]

    def _eog_positions(self, ids: np.ndarray | None) -> np.ndarray:
        """Where the EOG tokens lie in the row (a whole row: the tokens themselves; among
        candidates, only those the grammar allows)."""
        if ids is None:
            return self._eog
        ok = self._eog[self.allows(self._eog, np.zeros(len(self._eog), np.float32))]
        return np.flatnonzero(np.isin(ids, ok)) if len(ok) else ok

    def _unranked(self) -> int:
        """An allowed token where the device's best tokens hold none: an end of generation,
        else a one-byte token (the lowest byte), else GrammarError."""
        for tokens in (self._eog, self._single_bytes()):
            if len(tokens):
                ok = tokens[self.allows(tokens, np.zeros(len(tokens), np.float32))]
                if len(ok):
                    return int(ok[0])
        raise GrammarError("the grammar allows no token here")

    def _single_bytes(self) -> np.ndarray:
        fc = self._first_chars
        return np.empty(0, np.int64) if fc is None else fc.single[fc.single >= 0]

    def _starts(self) -> np.ndarray:
        """Whether a token with each first byte (FirstChars.first) may be allowed now: one
        check of the one-byte tokens (a byte without one: maybe)."""
        fc = self._first_chars
        assert fc is not None
        starts = np.ones(FirstChars.EOG + 1, dtype=bool)
        starts[FirstChars.EMPTY] = starts[FirstChars.EOG] = False  # EOGs: checked apart
        have = np.flatnonzero(fc.single >= 0)
        starts[have] = self.allows(fc.single[have], np.zeros(len(have), np.float32))
        return starts
