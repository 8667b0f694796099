"""A model whose logits come out NaN (its arithmetic overflowed, as a GGUF of random weights
does on a GPU) costs no other request: each of its rows gives a token among its candidates,
never an id outside the vocabulary, on which llama.cpp aborts the whole process. The model is
the embedded one with its output norm set to NaN, so every logit of every row is NaN."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import gguf
import numpy as np
import pytest

from uma_serve.core import protocol as p
from uma_serve.core.config import default_model_path
from uma_serve.core.sampling import LOGPROB_FLOOR

from .helpers import Daemon, gen, start_daemon


@pytest.fixture(scope="module")
def nan_model_daemon(tmp_path_factory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("nan-logits")
    model = tmp / "nan-logits.gguf"
    shutil.copyfile(default_model_path(), model)
    norm = next(t for t in gguf.GGUFReader(model).tensors if t.name == "output_norm.weight")
    with model.open("r+b") as f:
        f.seek(norm.data_offset)
        f.write(np.full(norm.n_elements, np.nan, dtype=np.float32).tobytes())
    daemon = start_daemon(tmp, "--model", str(model), "--n-ctx", "2048", "--n-seq", "4")
    yield daemon
    daemon.stop()


def test_nan_logits_give_tokens_and_the_daemon_serves_on(nan_model_daemon: Daemon) -> None:
    with nan_model_daemon.client() as c:
        for temperature in (0.0, 0.8, 0.0):  # greedy first: it drew an id outside the vocabulary
            req = gen("Once upon a time", max_tokens=5, ignore_eos=True, temperature=temperature)
            done = c.complete(req)
            assert done.reason == "length" and done.usage.completion_tokens == 5
    assert nan_model_daemon.proc.poll() is None
    assert "Traceback" not in nan_model_daemon.log()
    assert "Warning" not in nan_model_daemon.log()  # numpy's inf - inf, once per process


def test_nan_logits_report_the_logprob_floor(nan_model_daemon: Daemon) -> None:
    """A NaN logprob would go out as JSON null, which no client decodes as a float (the
    client's connection then failed at that event): it is the floor, -9999.0, as OpenAI's."""
    with nan_model_daemon.client() as c:
        events = list(c.stream(gen("Once upon a time", max_tokens=3, ignore_eos=True, logprobs=2)))
    tokens = [e for e in events if isinstance(e, p.TokenEvent)]
    assert len(tokens) == 3
    for event in tokens:
        assert event.logprobs is not None and len(event.logprobs.top) == 2
        assert event.logprobs.token.logprob == LOGPROB_FLOOR
        assert [t.logprob for t in event.logprobs.top] == [LOGPROB_FLOOR] * 2
