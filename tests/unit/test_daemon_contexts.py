"""How many llama.cpp contexts umad makes (--contexts, auto) and each one's share."""

from __future__ import annotations

from dataclasses import replace

from uma_serve.core import config as cfg
from uma_serve.core.daemon import context_share, n_contexts
from uma_serve.core.runtime import RuntimeParams

GIB = 1 << 30


def test_auto_is_one_on_a_cpu_and_below_32_sequences() -> None:
    c = replace(cfg.Config(), n_seq=64)
    assert n_contexts(c, on_gpu=False, model_bytes=GIB) == 1
    assert n_contexts(replace(c, n_seq=16), on_gpu=True, model_bytes=GIB) == 1


def test_auto_on_a_gpu_depends_on_the_model_size() -> None:
    c = replace(cfg.Config(), n_seq=64)
    assert n_contexts(c, on_gpu=True, model_bytes=GIB // 4) == 4  # one per 16 sequences
    assert n_contexts(replace(c, n_seq=32), on_gpu=True, model_bytes=GIB // 4) == 2
    assert n_contexts(replace(c, n_seq=256), on_gpu=True, model_bytes=GIB // 4) == 4
    assert n_contexts(c, on_gpu=True, model_bytes=5 * GIB) == 2  # weights read per context


def test_asked_for_contexts_are_given_up_to_the_sequences() -> None:
    c = replace(cfg.Config(), n_seq=4, contexts=3)
    assert n_contexts(c, on_gpu=False, model_bytes=GIB) == 3
    assert n_contexts(replace(c, contexts=9), on_gpu=True, model_bytes=GIB) == 4


def test_the_shares_add_up_to_the_whole() -> None:
    whole = RuntimeParams("m.gguf", n_ctx=8192, n_seq=10, n_seq_cache=5)
    parts = [context_share(whole, 3, i) for i in range(3)]
    assert [p.n_seq for p in parts] == [4, 3, 3]
    assert [p.n_seq_cache for p in parts] == [2, 2, 1]
    assert all(p.n_ctx // p.n_seq == whole.n_ctx // whole.n_seq for p in parts)
    assert sum(p.n_ctx for p in parts) <= whole.n_ctx
