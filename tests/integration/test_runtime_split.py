"""llama.cpp's multi-GPU split options reach the model load (a CPU build ignores them, so this
checks the plumbing; docs/GPU.md covers a model split over several GPUs)."""

from __future__ import annotations

import llama_cpp as ll
import numpy as np
import pytest

from uma_serve.core.config import default_model_path
from uma_serve.core.runtime import Runtime, RuntimeParams, Span

MODES = {"none": ll.LLAMA_SPLIT_MODE_NONE, "layer": ll.LLAMA_SPLIT_MODE_LAYER,
         "row": ll.LLAMA_SPLIT_MODE_ROW}  # fmt: skip
HELLO = [2, 9259]  # Gemma 3's BOS and "Hello", from the embedded model's own vocabulary


def spy_on_the_load(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """What llama.cpp's model load is given, read at the call (the load itself goes ahead)."""
    seen: dict[str, object] = {}
    real = ll.llama_model_load_from_file

    def load(path: bytes, mparams: ll.llama_model_params) -> ll.llama_model_p:
        n = int(ll.llama_max_devices())
        split = mparams.tensor_split
        seen.update(split_mode=mparams.split_mode, main_gpu=mparams.main_gpu,
                    tensor_split=tuple(split[i] for i in range(n)) if split else ())  # fmt: skip
        return real(path, mparams)

    monkeypatch.setattr(ll, "llama_model_load_from_file", load)
    return seen


@pytest.mark.parametrize(
    ("mode", "shares", "main_gpu"), [("none", (), 0), ("layer", (3.0, 1.0), 1), ("row", (1.0,), 2)]
)
def test_split_options_reach_the_model_load(
    monkeypatch: pytest.MonkeyPatch, mode: str, shares: tuple[float, ...], main_gpu: int
) -> None:
    """llama.cpp gets the split mode, the main GPU and every device's share (the rest 0), and
    the model it loads works: the real tokenizer's ids for "Hello", text back from them, and a
    decode."""
    seen = spy_on_the_load(monkeypatch)
    params = RuntimeParams(
        default_model_path(), n_ctx=256, n_seq=1, split_mode=mode, tensor_split=shares,
        main_gpu=main_gpu,
    )  # fmt: skip
    rt = Runtime(params)
    try:
        padded = (*shares, *[0.0] * (int(ll.llama_max_devices()) - len(shares)))
        assert seen == {"split_mode": MODES[mode], "main_gpu": main_gpu,
                        "tensor_split": padded if shares else ()}  # fmt: skip
        assert rt.tokenize("Hello") == HELLO
        assert b"".join(rt.piece(t) for t in HELLO) == b"Hello"
        rc, rows = rt.decode([Span(0, 0, HELLO, True)])
        assert rc == 0 and rows == [1] and np.isfinite(rt.logits_row(rows[0])).all()
    finally:
        rt.close()


def test_more_shares_than_devices_is_refused() -> None:
    shares = (1.0,) * (int(ll.llama_max_devices()) + 1)
    with pytest.raises(ValueError, match="devices at most"):
        Runtime(RuntimeParams(default_model_path(), n_ctx=256, n_seq=1, tensor_split=shares))
