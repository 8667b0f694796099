"""The instruction-tuned chat model (SmolLM2-135M-Instruct, what `make run` serves) under a
real umad and gateway, for the tests whose point is a sensible answer (tool loops, agents).
``--deterministic``: a request's greedy output depends on it alone, so a streamed and a whole
request can be compared token for token.

conftest.py registers these for every module.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from uma_serve.core.config import chat_model_path

from .gateway_helpers import Gateway, start_gateway
from .helpers import Daemon, start_daemon

__all__ = ["chat_core", "chat_gateway", "chat_model"]


@pytest.fixture(scope="session")
def chat_core() -> Iterator[Daemon]:
    with tempfile.TemporaryDirectory(prefix="uma-chat-") as tmp:
        daemon = start_daemon(
            Path(tmp), "--model", chat_model_path(), "--n-ctx", "8192", "--max-tokens", "512",
            "--seed", "1234", "--deterministic", "on",
        )  # fmt: skip
        yield daemon
        daemon.stop()


@pytest.fixture(scope="session")
def chat_gateway(chat_core) -> Iterator[Gateway]:
    gw = start_gateway(chat_core.socket)
    yield gw
    gw.stop()


@pytest.fixture(scope="session")
def chat_model(chat_gateway) -> str:
    return chat_gateway.client().models.list().data[0].id
