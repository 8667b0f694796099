"""Shadow tags with the real model: llama.cpp's slot search hands a KV cell that belongs to
ONE sequence to another once it lies a window (512 positions for Gemma 3) behind its
sequence's last position, even with swa_full. The prefix cache needs those cells, so the
runtime tags each sequence's cells with a second (shadow) id, every ``lag`` positions. A model
with no window needs no shadow, and gets none."""

from __future__ import annotations

import llama_cpp as ll
import pytest

from uma_serve.core.config import chat_model_path, default_model_path
from uma_serve.core.runtime import Runtime, RuntimeParams, Span

TEXT = "The lighthouse keeper logs the weather every morning at six. " * 200


def _recycle(rt: Runtime) -> int:
    """Cells, in the slot search's order: sequence 3 takes the first 150 and leaves (the
    search starts over there); sequence 0 takes the next 1,200 (prompt chunks, then one-token
    steps), sequence 2 the next 298; the rest is free. Sequence 1 then asks for 300 cells.
    Returns sequence 0's first position still in the cache (0: none of its cells taken)."""
    tokens = rt.tokenize(TEXT)
    assert rt.decode([Span(3, 0, tokens[:150], False)])[0] == 0
    pos = 0
    for n in (512, 512, 150) + (1,) * 26:
        assert rt.decode([Span(0, pos, tokens[pos : pos + n], True)])[0] == 0
        pos += n
    assert rt.decode([Span(2, 0, tokens[:298], False)])[0] == 0
    rt.seq_clear(3)
    assert rt.decode([Span(1, 0, tokens[:300], True)])[0] == 0
    assert rt.seq_pos_max(0) == pos - 1
    return rt.seq_pos_min(0)


@pytest.mark.parametrize("shadow", [True, False])
def test_shadow_tags_keep_a_sequences_old_cells(shadow: bool) -> None:
    """Without shadow tags sequence 1 gets sequence 0's oldest cells (the case this guards
    against happens); with them (tagged lazily) sequence 0 keeps every position."""
    params = RuntimeParams(default_model_path(), n_ctx=2048, n_seq=4, swa_full=True, shadow=shadow)
    rt = Runtime(params)
    try:
        assert ll.llama_n_seq_max(rt.ctx) == (8 if shadow else 4)
        first = _recycle(rt)
    finally:
        rt.close()
    assert (first == 0) if shadow else (first > 0)


def test_a_model_with_no_window_needs_no_shadow() -> None:
    """SmolLM2 has no sliding window: llama.cpp reuses only empty cells, so the runtime drops
    the shadow ids it was asked for (half the ids each decode checks, one pass less a trim)
    and sequence 0 still keeps every position."""
    params = RuntimeParams(chat_model_path(), n_ctx=2048, n_seq=4, swa_full=True, shadow=True)
    rt = Runtime(params)
    try:
        assert not rt.params.shadow and ll.llama_n_seq_max(rt.ctx) == 4
        first = _recycle(rt)
    finally:
        rt.close()
    assert first == 0


def test_clear_frees_an_id_and_its_shadow_in_both_caches() -> None:
    """A sequence that ran past the sliding window, and its shadow, hold nothing after a
    clear, in the full-attention cache as in the window's (the saved state counts both)."""
    params = RuntimeParams(default_model_path(), n_ctx=2048, n_seq=4, swa_full=True, shadow=True)
    rt = Runtime(params)
    try:
        empty = len(rt.seq_state(2))
        tokens = rt.tokenize(TEXT)
        pos = 0
        for n in (512, 200) + (1,) * 40:  # past Gemma 3's 512-position window, shadow tagged
            assert rt.decode([Span(0, pos, tokens[pos : pos + n], True)])[0] == 0
            pos += n
        shadow = 0 + rt._n_ids
        assert len(rt.seq_state(0)) > empty and len(rt.seq_state(shadow)) > empty
        rt.seq_clear(0)
        assert len(rt.seq_state(0)) == empty and len(rt.seq_state(shadow)) == empty
        assert rt.seq_pos_max(0) == -1
        rt.seq_clear(0)  # nothing left: no error
        assert len(rt.seq_state(0)) == empty
    finally:
        rt.close()


@pytest.mark.parametrize("n", [200, 600])
def test_a_copy_shorter_than_the_lag_needs_no_shadow(n: int) -> None:
    """A copy into another id (a finished reply stored in the prefix cache) tags the shadow
    only from the shadow's lag (256 positions) on: fewer positions never leave the copy's
    window, so the slot search cannot take them. Laid out as ``_recycle``: sequence 3's 150
    cells freed, sequence 0's ``n`` next copied to id 2 and cleared, then sequence 1 asks for
    300 cells; id 2 keeps every position (600 without its shadow would lose its first 89)."""
    params = RuntimeParams(default_model_path(), n_ctx=2048, n_seq=4, swa_full=True, shadow=True)
    rt = Runtime(params)
    try:
        tokens = rt.tokenize(TEXT)
        assert rt.decode([Span(3, 0, tokens[:150], False)])[0] == 0
        pos = 0
        for size in (512, n - 512) if n > 512 else (n,):
            assert rt.decode([Span(0, pos, tokens[pos : pos + size], False)])[0] == 0
            pos += size
        rt.seq_clear(3)
        rt.seq_copy(0, 2, n)
        rt.seq_clear(0)
        assert rt.decode([Span(1, 0, tokens[:300], True)])[0] == 0
        assert rt.seq_pos_min(2) == 0 and rt.seq_pos_max(2) == n - 1
        assert (rt._shadowed[2] > 0) == (n >= rt._shadow_lag)  # the short copy saved a pass
    finally:
        rt.close()


def test_a_conversations_next_turn_on_a_short_cached_turn_keeps_its_cells() -> None:
    """A conversation's shape: its first turn (100 positions) is stored without a shadow,
    the next turn reuses it, the entry is then evicted and the turn runs past the window.
    Its shadow tags start at position 0 (a copy without a shadow tags nothing), so when
    another sequence asks for cells the turn keeps every position."""
    params = RuntimeParams(default_model_path(), n_ctx=2048, n_seq=4, swa_full=True, shadow=True)
    rt = Runtime(params)
    try:
        tokens = rt.tokenize(TEXT)
        assert rt.decode([Span(3, 0, tokens[:150], False)])[0] == 0
        assert rt.decode([Span(0, 0, tokens[:100], True)])[0] == 0  # the first turn
        rt.seq_copy(0, 2, 100)  # stored in the cache: shorter than the lag, no shadow
        rt.seq_clear(0)
        rt.seq_copy(2, 1, 99)  # the next turn reuses it
        rt.seq_clear(2)  # the entry evicted: the turn alone holds those cells
        pos = 99
        for n in (512, 188):  # past Gemma 3's 512-position window
            assert rt.decode([Span(1, pos, tokens[pos : pos + n], True)])[0] == 0
            pos += n
        rt.seq_clear(3)
        assert rt.decode([Span(3, 0, tokens[:300], True)])[0] == 0
        assert rt.seq_pos_min(1) == 0 and rt.seq_pos_max(1) == pos - 1
    finally:
        rt.close()
