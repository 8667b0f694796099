"""bench synth-model: a GGUF with a real model's shapes that llama.cpp loads and decodes with,
a dense and a mixture-of-experts shape, one layer each. The tokenizer is SmolLM2's (49,152
tokens, a BPE with merges: every kind of tokenizer field is copied); bench's default, the
embedded Gemma's (262,144 tokens), takes a minute of this test's time."""

from __future__ import annotations

from pathlib import Path

import gguf
import llama_cpp as ll
import pytest

from uma_serve.bench.synth_model import SHAPES, write
from uma_serve.core.config import chat_model_path


def _decodes(path: Path) -> list[int]:
    """Greedy ids of a few decode steps through llama.cpp's own API."""
    mp = ll.llama_model_default_params()
    mp.use_extra_bufts = False
    model = ll.llama_model_load_from_file(str(path).encode(), mp)
    assert model, "llama.cpp could not load the synthetic GGUF"
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = 256, 2, 2
    ctx = ll.llama_init_from_model(model, cp)
    vocab = ll.llama_model_get_vocab(model)
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    out, token = [], 2
    for _ in range(4):
        batch = ll.llama_batch_get_one((ll.llama_token * 1)(token), 1)
        assert ll.llama_decode(ctx, batch) == 0
        logits = ll.llama_get_logits_ith(ctx, -1)
        row = [logits[i] for i in range(n_vocab)]
        assert all(x == x for x in row[:1000]), "NaN logits"
        token = max(range(n_vocab), key=row.__getitem__)
        out.append(token)
    ll.llama_free(ctx)
    ll.llama_model_free(model)
    return out


@pytest.mark.parametrize("name", ["gemma3-4b", "olmoe-1b-7b"])
def test_a_real_shape_loads_and_decodes(name: str, tmp_path: Path) -> None:
    from dataclasses import replace

    shape = replace(SHAPES[name], layers=1)
    path = tmp_path / f"{name}.gguf"
    write(shape, path, Path(chat_model_path()))
    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == shape.arch
    dims = {t.name: t.shape.tolist() for t in reader.tensors}
    assert dims["blk.0.attn_q.weight"] == [shape.hidden, shape.heads * shape.head_dim]
    if shape.experts:
        assert dims["blk.0.ffn_up_exps.weight"] == [shape.hidden, shape.ffn, shape.experts]
    else:
        assert dims["blk.0.ffn_up.weight"] == [shape.hidden, shape.ffn]
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 49152  # SmolLM2's vocabulary
    assert len(reader.fields["tokenizer.ggml.merges"].data) > 40000
    assert len(_decodes(path)) == 4
