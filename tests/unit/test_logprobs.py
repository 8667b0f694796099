"""Per-token log-probabilities: the core's computation and the gateway's two OpenAI shapes."""

from __future__ import annotations

import math

import numpy as np

from uma_serve.core import protocol as p
from uma_serve.core.sampling import logprobs_of
from uma_serve.gateway.logprobs import chat_logprobs, text_logprobs


def test_logprobs_of_is_the_log_softmax_with_the_top_first() -> None:
    raw = np.array([0.0, 2.0, 1.0, -1.0, 2.0], dtype=np.float32)
    lse = math.log(sum(math.exp(x) for x in raw))
    lp = logprobs_of(raw, 2, 3, lambda t: f"<{t}>".encode())
    assert lp.token.token_id == 2 and math.isclose(lp.token.logprob, 1.0 - lse, abs_tol=1e-6)
    assert [t.token_id for t in lp.top][:2] in ([1, 4], [4, 1]) and lp.top[2].token_id == 2
    assert all(math.isclose(t.logprob, float(raw[t.token_id]) - lse, abs_tol=1e-6) for t in lp.top)
    assert lp.top[0].piece == f"<{lp.top[0].token_id}>".encode()
    assert logprobs_of(raw, 0, 0, lambda t: b"").top == []


def test_the_two_openai_shapes() -> None:
    def lp(piece: bytes, v: float) -> p.Logprobs:
        return p.Logprobs(p.TokenLogprob(1, v, piece), [p.TokenLogprob(1, v, piece)])

    lps = [lp(b" Hi", -0.5), lp(b"\xc3\xa9", -1.0)]
    block, end = text_logprobs(lps, 4)
    assert block["tokens"] == [" Hi", "é"] and block["text_offset"] == [4, 7] and end == 8
    assert block["top_logprobs"] == [{" Hi": -0.5}, {"é": -1.0}]
    chat = chat_logprobs(lps)
    assert chat["content"][1] == {
        "token": "é",
        "logprob": -1.0,
        "bytes": [0xC3, 0xA9],
        "top_logprobs": [{"token": "é", "logprob": -1.0, "bytes": [0xC3, 0xA9]}],
    }
