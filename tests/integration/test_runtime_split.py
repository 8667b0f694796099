"""llama.cpp's multi-GPU split options reach the model load (a CPU build ignores them, so this
checks the plumbing; docs/GPU.md covers a model split over several GPUs)."""

from __future__ import annotations

import llama_cpp as ll
import pytest

from uma_serve.core.config import default_model_path
from uma_serve.core.runtime import Runtime, RuntimeParams


@pytest.mark.parametrize(
    ("mode", "shares", "main_gpu"), [("none", (), 0), ("layer", (3.0, 1.0), 0), ("row", (1.0,), 0)]
)
def test_split_options_load_the_model(mode: str, shares: tuple[float, ...], main_gpu: int) -> None:
    params = RuntimeParams(
        default_model_path(), n_ctx=256, n_seq=1, split_mode=mode, tensor_split=shares,
        main_gpu=main_gpu,
    )  # fmt: skip
    rt = Runtime(params)
    try:
        assert rt.tokenize("Hello")
    finally:
        rt.close()


def test_more_shares_than_devices_is_refused() -> None:
    shares = (1.0,) * (int(ll.llama_max_devices()) + 1)
    with pytest.raises(ValueError, match="devices at most"):
        Runtime(RuntimeParams(default_model_path(), n_ctx=256, n_seq=1, tensor_split=shares))
