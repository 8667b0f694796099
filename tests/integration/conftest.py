"""The integration tests' shared fixtures: one plain gateway and one strict gateway (auth on,
one request in flight, small body limits) over the session's umad (tests/conftest.py), the
openai SDK on the plain one; and the instruct chat model's (chat_fixtures.py), so that one
chat core serves the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import OpenAI

from .chat_fixtures import *  # noqa: F403
from .gateway_helpers import API_KEYS, Gateway, start_gateway


@pytest.fixture(scope="session")
def gateway(umad) -> Iterator[Gateway]:
    gw = start_gateway(umad.socket)
    yield gw
    gw.stop()


@pytest.fixture(scope="session")
def strict_gateway(umad) -> Iterator[Gateway]:
    """Auth on (two keys), one generation in flight at most, 64 KiB bodies."""
    keys = [a for k in API_KEYS for a in ("--api-key", k)]
    gw = start_gateway(umad.socket, *keys, "--max-inflight", "1", "--max-body-bytes", "65536")
    yield gw
    gw.stop()


@pytest.fixture(scope="session")
def sdk(gateway) -> OpenAI:
    return gateway.client()


@pytest.fixture(scope="session")
def model_id(sdk) -> str:
    return sdk.models.list().data[0].id
