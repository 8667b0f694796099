"""Shared fixtures: a real umad subprocess on the embedded default model."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration.helpers import Daemon, start_daemon


@pytest.fixture(scope="session")
def umad() -> Iterator[Daemon]:
    """One daemon for the session: default model, 4 sequences, small limits for bad-input tests."""
    with tempfile.TemporaryDirectory(prefix="uma-test-") as tmp:
        daemon = start_daemon(
            Path(tmp),
            "--n-seq", "4",
            "--n-ctx", "4096",
            "--max-sessions", "16",
            "--max-prompt-bytes", "20000",
            "--max-tokens", "512",
            "--seed", "1234",
        )  # fmt: skip
        yield daemon
        daemon.stop()


@pytest.fixture
def fresh_tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="uma-test-") as tmp:
        yield Path(tmp)
