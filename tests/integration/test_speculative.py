"""Prompt-lookup speculative decoding with the real model: output identical with it on and off.

The prompt asks to repeat a text longer than Gemma 3's 512-token sliding window, so drafts are
verified (and rejected ones removed from the KV) where the SWA layers have already let old
positions go.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from uma_serve.core import protocol as p

from .helpers import Daemon, gen, start_daemon
from .test_prefix_cache import FACTS

TEXT = " ".join(FACTS[(i * 5) % len(FACTS)] for i in range(48))
PROMPT = f"Copy the text exactly.\nText: {TEXT}\nCopy: {TEXT[:120]}"
MAX_TOKENS = 48


def _daemon(tmp: str, *extra: str) -> Daemon:
    return start_daemon(
        Path(tmp), "--n-seq", "4", "--n-ctx", "8192", "--prefix-cache-tokens", "0", *extra
    )


@pytest.fixture(scope="module")
def spec_on() -> Iterator[Daemon]:
    with tempfile.TemporaryDirectory(prefix="uma-spec-") as tmp:
        d = _daemon(tmp, "--spec-draft", "6")
        yield d
        d.stop()


@pytest.fixture(scope="module")
def spec_off() -> Iterator[Daemon]:
    with tempfile.TemporaryDirectory(prefix="uma-spec0-") as tmp:
        d = _daemon(tmp, "--spec-draft", "0")
        yield d
        d.stop()


def complete(d: Daemon, prompt: str, **kw) -> p.CompletionEvent:
    kw.setdefault("max_tokens", MAX_TOKENS)
    with d.client() as c:
        done = c.complete(gen(prompt, ignore_eos=True, stream=False, **kw))
    assert isinstance(done, p.CompletionEvent), done
    return done


def test_greedy_output_is_identical(spec_on: Daemon, spec_off: Daemon) -> None:
    before = spec_on.metrics()
    on = complete(spec_on, PROMPT)
    after = spec_on.metrics()
    off = complete(spec_off, PROMPT)
    assert on.text == off.text
    assert on.usage.completion_tokens == off.usage.completion_tokens == MAX_TOKENS
    drafted = after["spec_drafted_tokens_total"] - before["spec_drafted_tokens_total"]
    accepted = after["spec_accepted_tokens_total"] - before["spec_accepted_tokens_total"]
    assert drafted > 0 and accepted > 0
    assert spec_off.metrics()["spec_drafted_tokens_total"] == 0


def test_seeded_sampling_is_identical(spec_on: Daemon, spec_off: Daemon) -> None:
    kw = dict(temperature=0.7, top_k=40, seed=11, max_tokens=32)
    assert complete(spec_on, PROMPT, **kw).text == complete(spec_off, PROMPT, **kw).text


def test_stop_string_and_length_still_apply(spec_on: Daemon, spec_off: Daemon) -> None:
    stop = FACTS[0].split()[3]
    on = complete(spec_on, PROMPT, stop=[stop], max_tokens=40)
    off = complete(spec_off, PROMPT, stop=[stop], max_tokens=40)
    assert on.text == off.text and on.reason == off.reason
    short = complete(spec_on, PROMPT, max_tokens=5)
    assert short.usage.completion_tokens == 5
