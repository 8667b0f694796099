"""bench warm-floor's multiply-add count on hand-built shapes."""

from __future__ import annotations

from uma_serve.bench.warm_floor import macs
from uma_serve.core.runtime.params import ModelShape


def shape(n_swa: int, swa_layers: int) -> ModelShape:
    # weights outside the embedding: 100; per query, position and layer: 1 x (2 + 2) = 4
    return ModelShape(
        n_params=10 * 4 + 100, n_vocab=10, n_embd=4, n_layer=3, n_head=1, head_k=2, head_v=2,
        n_swa=n_swa, swa_layers=swa_layers,
    )  # fmt: skip


def test_alone_counts_weights_own_attention_and_one_logits_row() -> None:
    alone, extra = macs(shape(0, 0), cached=0, n_question=2)
    assert alone == 2 * 100 + (1 + 2) * 4 * 3 + 10 * 4
    assert extra == 0


def test_global_layers_attend_to_every_cached_position() -> None:
    _, extra = macs(shape(0, 0), cached=5, n_question=2)
    assert extra == 2 * 4 * 3 * 5


def test_window_layers_attend_to_the_cached_positions_inside_the_window() -> None:
    # window 2 (the token and one before it): token 0 sees 1 cached position, token 1 none
    _, extra = macs(shape(2, 2), cached=5, n_question=2)
    assert extra == 4 * (1 * 5 + 2 * 1) + 4 * (1 * 5 + 2 * 0)
