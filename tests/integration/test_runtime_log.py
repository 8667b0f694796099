"""ggml's messages past start-up: dropped in C unless the log is at debug level (on a GPU the
CUDA backend logs one per decode, and the Python callback would take the GIL inside it)."""

from __future__ import annotations

import logging

import llama_cpp as ll
import pytest

from uma_serve.core.config import default_model_path
from uma_serve.core.runtime import Runtime, RuntimeParams

GGML_LOG_LEVEL_WARN = 3


def probe() -> None:
    ll.llama_cpp._lib.ggml_log_internal(GGML_LOG_LEVEL_WARN, b"uma-probe: a ggml warning\n")


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_ggml_messages_after_start_up(level: int, caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("uma.llama")
    old = logger.level
    logger.setLevel(level)
    try:
        with caplog.at_level(level, logger="uma.llama"):
            rt = Runtime(RuntimeParams(default_model_path(), n_ctx=256, n_seq=1))
            caplog.clear()
            probe()
            rt.close()
    finally:
        logger.setLevel(old)
    probes = [r for r in caplog.records if "uma-probe" in r.getMessage()]
    if level == logging.DEBUG:
        assert [r.levelno for r in probes] == [logging.WARNING]
    else:
        assert probes == []
