"""The grammar sampler (core/runtime/grammar.py) on the real model: output in the language."""

from __future__ import annotations

import json

import numpy as np
import pytest

from uma_serve.core.config import default_model_path
from uma_serve.core.runtime import Runtime, RuntimeParams, SamplingParams, Span
from uma_serve.core.runtime.grammar import GrammarError, GrammarSampler, check_grammar

JSON_ARRAY = r"""root ::= "[" ws item ("," ws item)* "]"
item ::= [0-9]+ | "\"" [a-z]+ "\""
ws ::= " "?"""


@pytest.fixture(scope="module")
def runtime():
    rt = Runtime(RuntimeParams(default_model_path(), n_ctx=1024, n_seq=1))
    yield rt
    rt.close()


def run(rt: Runtime, sampler: GrammarSampler, prompt: str, steps: int) -> tuple[str, bool]:
    """Decode until EOG or ``steps`` tokens; the text and whether it ended by EOG."""
    rt.seq_clear(0)
    tokens = rt.tokenize(prompt)
    rc, rows = rt.decode([Span(0, 0, tokens, True)])
    pos, out = len(tokens), b""
    for _ in range(steps):
        token = sampler.sample(rt.logits_row(rows[0]))
        if rt.is_eog(token):
            return out.decode(), True
        out += rt.piece(token)
        rc, rows = rt.decode([Span(0, pos, [token], True)])
        assert rc == 0
        pos += 1
    return out.decode(), False


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_output_follows_the_grammar_and_ends(runtime, temperature) -> None:
    params = SamplingParams(temperature=temperature, top_k=40, top_p=0.95, min_p=0.05, seed=7)
    sampler = GrammarSampler(runtime.vocab, JSON_ARRAY, params, 0, runtime.eog_tokens)
    text, ended = run(runtime, sampler, "A list of numbers:", 60)
    sampler.free()
    if ended:
        value = json.loads(text)
        assert isinstance(value, list) and value
    assert text.startswith("[")


def test_greedy_without_a_refusal_is_plain_greedy(runtime) -> None:
    """Where the grammar accepts the model's own choice, nothing changes."""
    params = SamplingParams(temperature=0.0)
    sampler = GrammarSampler(runtime.vocab, "root ::= [^\\x00]*", params, 0)
    runtime.seq_clear(0)
    tokens = runtime.tokenize("The capital of France is")
    rc, rows = runtime.decode([Span(0, 0, tokens, True)])
    row = np.array(runtime.logits_row(rows[0]))
    assert sampler.sample(row.copy()) == int(np.argmax(row))
    sampler.free()


def test_a_bad_grammar_is_refused(runtime) -> None:
    with pytest.raises(GrammarError):
        check_grammar(runtime.vocab, "root ::= undefined-rule")
    check_grammar(runtime.vocab, JSON_ARRAY)
