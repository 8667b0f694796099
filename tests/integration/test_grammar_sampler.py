"""A grammar (core/runtime/grammar.py) through the engine's sampler on the real model: the
output is in the language."""

from __future__ import annotations

import dataclasses
import json

import llama_cpp as ll
import numpy as np
import pytest

from uma_serve.core.config import default_model_path
from uma_serve.core.runtime import Runtime, RuntimeParams, Span
from uma_serve.core.runtime.grammar import FirstChars, GrammarError, check_grammar
from uma_serve.core.sampling import GRAMMAR_TOP_K, Row, Sampler, SamplerState

from .helpers import gen

JSON_ARRAY = r"""root ::= "[" ws item ("," ws item)* "]"
item ::= [0-9]+ | "\"" [a-z]+ "\""
ws ::= " "?"""


@pytest.fixture(scope="module")
def runtime():
    rt = Runtime(RuntimeParams(default_model_path(), n_ctx=1024, n_seq=1))
    yield rt
    rt.close()


def run(rt: Runtime, state: SamplerState, prompt: str, steps: int) -> tuple[str, bool]:
    """Decode until EOG or ``steps`` tokens; the text and whether it ended by EOG."""
    rt.seq_clear(0)
    return run_on(rt, Sampler(rt), state, 0, prompt, steps)


def run_on(
    rt: Runtime, sampler: Sampler, state: SamplerState, seq_id: int, prompt: str, steps: int
) -> tuple[str, bool]:
    tokens = rt.tokenize(prompt)
    rc, rows = rt.decode([Span(seq_id, 0, tokens, True)])
    pos, out = len(tokens), b""
    for _ in range(steps):
        [(token, _)] = sampler.sample([Row(state, rows[0])])
        if rt.is_eog(token):
            return out.decode(), True
        out += rt.piece(token)
        rc, rows = rt.decode([Span(seq_id, pos, [token], True)])
        assert rc == 0
        pos += 1
    return out.decode(), False


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_output_follows_the_grammar_and_ends(runtime, temperature) -> None:
    req = gen(temperature=temperature, top_k=40, top_p=0.95, min_p=0.05, seed=7, grammar=JSON_ARRAY)
    state = Sampler(runtime).new(0, req, 0)
    text, ended = run(runtime, state, "A list of numbers:", 120)
    state.free()
    assert ended, text  # once the array closes the grammar allows only the end
    value = json.loads(text)
    assert isinstance(value, list) and value and all(isinstance(v, int | str) for v in value)


def test_greedy_without_a_refusal_is_plain_greedy(runtime) -> None:
    """Where the grammar accepts the model's own choice, nothing changes."""
    sampler = Sampler(runtime)
    state = sampler.new(0, gen(temperature=0.0, grammar="root ::= [^\\x00]*"), 0)
    runtime.seq_clear(0)
    tokens = runtime.tokenize("The capital of France is")
    rc, rows = runtime.decode([Span(0, 0, tokens, True)])
    row = np.array(runtime.logits_row(rows[0]))
    assert sampler.sample([Row(state, rows[0])])[0][0] == int(np.argmax(row))
    state.free()


def test_a_refused_token_is_drawn_again_from_the_allowed_ones(runtime) -> None:
    """A grammar of digits only after a prose prompt: the model's own first choice is refused
    and the token comes from the allowed ones, the best of them when greedy."""
    sampler = Sampler(runtime)
    state = sampler.new(0, gen(temperature=0.0, grammar="root ::= [0-9]+"), 0)
    runtime.seq_clear(0)
    rc, rows = runtime.decode([Span(0, 0, runtime.tokenize("The capital of France is"), True)])
    row = np.array(runtime.logits_row(rows[0]))
    [(token, _)] = sampler.sample([Row(state, rows[0])])
    pieces = [runtime.piece(t) for t in range(runtime.n_vocab)]
    digits = [t for t, b in enumerate(pieces) if b and not b.strip(b"0123456789")]
    assert token != int(np.argmax(row)) and token in digits
    assert token == max(digits, key=lambda t: row[t])
    state.free()


@pytest.mark.parametrize("min_p", [0.05, 0.0])
def test_the_allowed_candidates_are_the_whole_rows_allowed_best(runtime, min_p) -> None:
    """The grammar checks only the row's best tokens, band by band: along a JSON answer, what
    it allows is what masking the whole row allows, among the top-k and down to where the
    chain could still draw one; and with min-p, searched among the row's best GRAMMAR_TOP_K
    only (what the device hands over for it), the same."""
    from uma_serve.bench.grammar_mix import SCHEMA
    from uma_serve.core.runtime.grammar import json_schema_gbnf

    sampler = Sampler(runtime)
    req = gen(temperature=0.8, top_k=40, min_p=min_p, seed=3, grammar=json_schema_gbnf(SCHEMA))
    state = sampler.new(0, req, 0)
    assert state.grammar is not None
    rng = np.random.default_rng(0)
    runtime.seq_clear(0)
    tokens = runtime.tokenize("Report the weather in Paris as JSON.\n")
    rc, rows = runtime.decode([Span(0, 0, tokens, True)])
    pos, refused = len(tokens), 0
    for _ in range(24):
        row = np.array(runtime.logits_row(rows[0]))
        ids, logits = state.grammar.allowed(row.copy(), state.p)
        if min_p:  # the device's best GRAMMAR_TOP_K in no order: the same allowed tokens
            best_ids = rng.permutation(np.argpartition(-row, GRAMMAR_TOP_K)[:GRAMMAR_TOP_K])
            wide = state.grammar.allowed(row[best_ids], state.p, best_ids)
            assert sorted(zip(*wide, strict=True)) == sorted(zip(ids, logits, strict=True))
        whole = np.flatnonzero(state.grammar.allows(np.arange(len(row)), row))
        assert set(ids.tolist()) <= set(whole.tolist()) and np.array_equal(logits, row[ids])
        best = whole[np.argsort(-row[whole], kind="stable")][:40]
        # min-p drops what lies below; without it, all the row's tokens there together hold
        # under 1e-4 of the best one's probability
        floor = row[best[0]] + (np.log(min_p) if min_p else 0.8 * np.log(1e-4 / len(row)))
        assert set(best[row[best] >= floor].tolist()) <= set(ids.tolist())
        refused += int(np.argmax(row)) not in whole
        [(token, _)] = sampler.sample([Row(state, rows[0])])
        if runtime.is_eog(token):
            break
        rc, rows = runtime.decode([Span(0, pos, [token], True)])
        pos += 1
    state.free()
    assert refused  # the grammar overruled the model somewhere: the bands were searched


def test_where_the_candidates_hold_no_allowed_token_an_allowed_one_is_taken(runtime) -> None:
    """Candidates that hold no token the grammar allows (the device's best of a row, none of
    them allowed): a one-byte token it allows, the lowest byte, as the vocabulary's own piece
    rather than its byte-fallback token; once the grammar is complete, the end of
    generation."""
    sampler = Sampler(runtime)
    state = sampler.new(0, gen(temperature=0.8, grammar='root ::= [0-9] "]"'), 0)
    g = state.grammar
    assert g is not None
    words = np.array(runtime.tokenize(" the capital of France", add_special=False))
    logits = np.linspace(5.0, 1.0, len(words), dtype=np.float32)
    ids, got = g.allowed(logits, state.p, words)
    assert runtime.piece(int(ids[0])) == b"0"  # the lowest byte, as the vocabulary's own piece
    byte = ll.llama_vocab_get_attr(runtime.vocab, int(ids[0])) & ll.LLAMA_TOKEN_ATTR_BYTE
    assert not byte
    assert got[0] <= logits.min()
    for token in runtime.tokenize("7]", add_special=False):
        g.accept(token)
    ids, _ = g.allowed(logits, state.p, words)
    assert runtime.is_eog(int(ids[0]))
    eog = runtime.eog_tokens[0]  # among the candidates: taken with its logit
    ids, got = g.allowed(np.append(logits, 3.0), state.p, np.append(words, eog))
    assert ids.tolist() == [eog] and got.tolist() == [3.0]
    state.free()


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"name": "get_weather", "parameters": CITY}
AGENT_PROMPT = (
    "You can call get_weather with a city. Call it as <tool_call>{...}</tool_call>.\n"
    "User: What is the weather in Paris?\nAssistant: "
)


def test_a_grammar_row_from_the_device_draws_what_its_whole_row_draws() -> None:
    """A constrained request's row on a runtime with a device top-k comes as its best
    GRAMMAR_TOP_K (a wider chain than the others'): along JSON answers and an agent's tool
    call (tool_choice required), sampled, the tokens are those of the same request drawing
    from whole rows, refusals and all."""
    from uma_serve.bench.grammar_mix import SCHEMA
    from uma_serve.core.runtime.grammar import json_schema_gbnf
    from uma_serve.gateway import gbnf

    prompt = "Report the weather in Paris as JSON with city, unit, temperature and notes.\n"
    params = RuntimeParams(default_model_path(), n_ctx=1024, n_seq=2, device_top_k=64)
    answers = []
    for k in (64, 0):
        rt = Runtime(dataclasses.replace(params, device_top_k=k))
        sampler, texts = Sampler(rt), []
        for seed in (1, 2):
            req = gen(temperature=0.8, seed=seed, grammar=json_schema_gbnf(SCHEMA))
            state = sampler.new(1, req, 0)
            sampler.apply()
            assert state.device_k == (GRAMMAR_TOP_K if k else 0)
            rt.seq_clear(1)
            text, _ = run_on(rt, sampler, state, 1, prompt, 80)
            texts.append(text)
            sampler.release(state)
        # an agent's turn under tool_choice required: a call, valid for the tool
        req = gen(temperature=0.8, seed=5, grammar=gbnf.tool_call_grammar([TOOL], parallel=False))
        state = sampler.new(1, req, 0)
        sampler.apply()
        rt.seq_clear(1)
        texts.append(run_on(rt, sampler, state, 1, AGENT_PROMPT, 60)[0])
        sampler.release(state)
        rt.close()
        answers.append(texts)
    assert answers[0] == answers[1]
    assert all(json.loads(text) for text in answers[0][:2])
    assert answers[0][2].endswith("</tool_call>")


def test_a_bad_grammar_is_refused(runtime) -> None:
    with pytest.raises(GrammarError):
        check_grammar(runtime.vocab, "root ::= undefined-rule")
    check_grammar(runtime.vocab, JSON_ARRAY)


def _accepts(runtime: Runtime, grammar: str, text: str) -> bool:
    """Whether llama.cpp's grammar engine takes ``text`` token by token (and may end there)."""
    g = runtime.grammar(grammar)
    try:
        for token in runtime.tokenize(text, add_special=False):
            if not g.allows(np.array([token]), np.zeros(1, np.float32))[0]:
                return False
            g.accept(token)
        eog = np.array(runtime.eog_tokens)
        return bool(g.allows(eog, np.zeros(len(eog), np.float32)).any())
    finally:
        g.free()


def test_tool_choice_auto_takes_text_or_a_valid_call_only(runtime) -> None:
    """tool_choice auto's grammar (gateway/gbnf.py): any answer that does not start with the
    call's tag, or calls valid against the tool's schema; a started call must be valid."""
    from uma_serve.gateway import gbnf

    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tool = {"name": "get_weather", "parameters": city}
    auto = gbnf.tool_call_grammar([tool], parallel=True, optional=True)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert _accepts(runtime, auto, "It is sunny in Paris, <tool_call> is not needed.")
    assert _accepts(runtime, auto, "<table> of cities")
    assert _accepts(runtime, auto, call)
    assert _accepts(runtime, auto, call + "\n" + call)
    assert not _accepts(runtime, auto, '<tool_call>\n{"name": "get_time", "arguments": {}}')
    assert not _accepts(runtime, auto, '<tool_call>\n{"name": "get_weather", "arguments": {}}')
    forced = gbnf.tool_call_grammar([tool], parallel=False)
    assert _accepts(runtime, forced, call) and not _accepts(runtime, forced, "Sunny.")


def test_the_bench_builds_the_gateways_json_schema_grammar() -> None:
    """bench grammar-mix's grammar is the one response_format builds: no raw control
    characters in JSON strings (the converter's own allow them, and json.loads refuses)."""
    from uma_serve.bench.grammar_mix import SCHEMA
    from uma_serve.core.runtime.grammar import json_schema_gbnf
    from uma_serve.gateway import gbnf

    grammar = json_schema_gbnf(SCHEMA)
    assert grammar == gbnf.json_schema_grammar(SCHEMA)
    assert "\\x00-\\x1F" in grammar


@pytest.mark.parametrize(
    ("grammar", "answer", "most"),
    [
        ("json", '{"city": "Paris", "unit": "celsius"', 0.9),
        ('root ::= "caf" ("é" | "è") " " [α-ω]+', "café αβ", 0.9),
        ('root ::= [^a-z]+ "x"', "AB", 0.1),  # it allows much: a little is ruled out
    ],
)
def test_a_first_byte_the_grammar_refuses_rules_out_only_refused_tokens(
    runtime, grammar, answer, most
) -> None:
    """A whole row's search skips the tokens whose first byte the grammar refuses now (one
    check of the one-byte tokens): every token the grammar allows (but the end of generation,
    which the search checks apart) has a first byte that passes, also where the next
    character is multi-byte UTF-8, and most tokens are ruled out where the grammar allows
    little."""
    from uma_serve.bench.grammar_mix import SCHEMA
    from uma_serve.core.runtime.grammar import json_schema_gbnf

    text = json_schema_gbnf(SCHEMA) if grammar == "json" else grammar
    state = Sampler(runtime).new(0, gen(temperature=0.0, grammar=text), 0)
    g = state.grammar
    assert g is not None
    every = np.arange(runtime.n_vocab)
    ruled_out = []
    for token in runtime.tokenize(answer, add_special=False):
        allowed = g.allows(every, np.zeros(len(every), np.float32))
        allowed &= g._first_chars.first != FirstChars.EOG  # checked apart, by the search
        passes = g._starts()[g._first_chars.first]
        assert passes[allowed].all(), [runtime.piece(int(t)) for t in every[allowed & ~passes]]
        ruled_out.append(1 - passes.mean())
        g.accept(token)
    state.free()
    assert max(ruled_out) > most, ruled_out
