"""The engine's sampling chain against llama.cpp's own chain (the oracle), on the real model's
logits, and the same tokens from either source of candidates in the daemon."""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
import pytest
from host_row import host_token, only
from llama_chain import LlamaChain

from uma_serve.clients.client import new_id
from uma_serve.core import protocol as p
from uma_serve.core.config import default_model_path
from uma_serve.core.draw import draw
from uma_serve.core.runtime import Runtime, RuntimeParams, Span
from uma_serve.core.sampling import GRAMMAR_TOP_K, SamplerState, needs_full_row

from .helpers import gen, start_daemon


@pytest.fixture(scope="module")
def runtime():
    rt = Runtime(RuntimeParams(default_model_path(), n_ctx=1024, n_seq=1))
    yield rt
    rt.close()


def chain(rt: Runtime, params: p.Sampling) -> LlamaChain:
    return LlamaChain(rt.n_vocab, params, 0)


def candidates(state: SamplerState, ids: np.ndarray, logits: np.ndarray) -> int:
    """The device's top-k candidates through the engine's chain (the backend-topk path)."""
    token = draw([state], ids[None], logits[None])[0]
    state.accept(token)
    return token


def generate_both(rt: Runtime, params: p.Sampling, prompt: str, steps: int):
    """Decode with llama.cpp's chain; at every step ask the numpy sampler too (same history)."""
    rt.seq_clear(0)
    tokens = rt.tokenize(prompt)
    oracle = chain(rt, params)
    mine = SamplerState(params, 0)
    rc, rows = rt.decode([Span(0, 0, tokens, True)])
    pos, pairs = len(tokens), []
    for _ in range(steps):
        token = host_token(
            mine, np.array(rt.logits_row(rows[0]))
        )  # a copy: the oracle reads it next
        theirs = oracle.sample(rt.ctx, rows[0])
        pairs.append((token, theirs))
        mine.history[-1] = theirs  # keep both histories identical even if they ever differ
        rc, rows = rt.decode([Span(0, pos, [theirs], True)])
        assert rc == 0
        pos += 1
    oracle.free()
    return pairs


def test_greedy_is_token_identical(runtime) -> None:
    pairs = generate_both(runtime, only(temperature=0.0), "The history of Rome", 40)
    assert all(a == b for a, b in pairs), pairs


def test_warm_up_leaves_an_empty_cache_and_the_same_output(runtime) -> None:
    """umad's start-up warm-up run: nothing of it stays in the KV cache or changes a result."""
    params = only(temperature=0.0)
    before = generate_both(runtime, params, "The capital of France is", 12)
    runtime.warm_up()
    assert runtime.seq_pos_max(0) == -1
    assert generate_both(runtime, params, "The capital of France is", 12) == before


def test_greedy_with_penalties_is_token_identical(runtime) -> None:
    params = only(temperature=0.0, repeat_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.6)
    pairs = generate_both(runtime, params, "1, 2, 3, 1, 2, 3, 1, 2,", 40)
    assert all(a == b for a, b in pairs), pairs


def test_greedy_with_logit_bias_is_token_identical(runtime) -> None:
    """A bias goes first in the chain, as llama.cpp's: the greedy token banned (-100), another
    pushed up; both samplers agree at every step and the banned token never comes."""
    plain = generate_both(runtime, only(temperature=0.0), "The capital of France", 8)
    banned = plain[0][1]
    pushed = runtime.tokenize(" Berlin", add_special=False)[0]
    params = only(temperature=0.0, logit_bias={banned: -100.0, pushed: 4.0})
    pairs = generate_both(runtime, params, "The capital of France", 24)
    assert all(a == b for a, b in pairs), pairs
    assert banned not in [b for _, b in pairs] and pairs != plain


def test_sampled_with_logit_bias_matches_the_chain(runtime) -> None:
    """Sampled: the row's top token banned and its fifth pushed up; the same law as the chain's
    (total variation over many draws), and the banned token is never drawn."""
    runtime.seq_clear(0)
    tokens = runtime.tokenize("Once upon a time, in a small village, there lived a")
    rc, rows = runtime.decode([Span(0, 0, tokens, True)])
    row = np.array(runtime.logits_row(rows[0]))
    order = np.argsort(row)[::-1]
    bias = {int(order[0]): -100.0, int(order[4]): 2.0}
    params = only(temperature=0.8, top_k=40, top_p=0.95, seed=7, logit_bias=bias)
    n = 3000
    state = SamplerState(params, 0)
    assert needs_full_row(params, 64)  # a device top-k cannot stand in for a biased row
    mine = [host_token(state, row.copy()) for _ in range(n)]
    theirs = []
    for i in range(n):
        oracle = chain(runtime, msgspec.structs.replace(params, seed=1000 + i))
        theirs.append(oracle.sample(runtime.ctx, rows[0]))
        oracle.free()
    support = sorted(set(mine) | set(theirs))
    p = np.array([mine.count(t) for t in support]) / n
    q = np.array([theirs.count(t) for t in support]) / n
    assert int(order[0]) not in support
    assert 0.5 * np.abs(p - q).sum() < 0.08, (support[:10], p[:10], q[:10])
    assert mine.count(int(order[4])) > n / 10  # the push shows


def test_logprobs_are_the_models_log_softmax(runtime, tmp_path) -> None:
    """The daemon's per-token log-probabilities: the log-softmax of the raw row (checked
    against the runtime's own logits for the first token), the alternatives most likely
    first, and untouched by a logit bias (they describe the model, not the sampler).

    Against a --deterministic daemon: there the prompt's logits are those of the prompt
    computed alone in one decode, as here. The suite's shared daemon has served this prompt
    before (other tests send it) and computes it from its cached prefix, the last token alone,
    through another attention kernel: 0.02 apart and more (docs/MEMORY.md, "Reproducible
    greedy output")."""
    prompt = "The capital of France is"
    runtime.seq_clear(0)
    rc, rows = runtime.decode([Span(0, 0, runtime.tokenize(prompt), True)])
    row = np.array(runtime.logits_row(rows[0]), dtype=np.float64)
    logsm = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
    order = [int(i) for i in np.argsort(-logsm)]
    daemon = start_daemon(tmp_path, "--deterministic", "on", "--n-ctx", "1024")
    try:
        with daemon.client() as c:
            done = c.complete(gen(prompt, max_tokens=4, temperature=0.0, logprobs=3, stream=False))
            assert isinstance(done, p.CompletionEvent) and done.logprobs is not None
            first = done.logprobs[0]
            assert first.token.token_id == order[0]
            assert [t.token_id for t in first.top] == order[:3]
            assert all(abs(t.logprob - logsm[t.token_id]) < 0.02 for t in first.top)
            for x in done.logprobs:  # greedy: the token is the most likely one
                assert x.top[0].token_id == x.token.token_id and x.token.logprob <= 0
                assert [t.logprob for t in x.top] == sorted(
                    (t.logprob for t in x.top), reverse=True
                )
            assert "".join(x.token.piece.decode() for x in done.logprobs) == done.text
            forced = order[50]
            req = gen(prompt, max_tokens=1, temperature=0.0, logprobs=0, logit_bias={forced: 100.0})
            done = c.complete(msgspec.structs.replace(req, stream=False))
            (only,) = done.logprobs
            assert only.token.token_id == forced and only.top == []
            assert abs(only.token.logprob - logsm[forced]) < 0.02  # the model's, not the biased
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    "params",
    [
        only(temperature=0.9, top_k=40, top_p=0.9, seed=1),
        only(temperature=0.7, top_p=0.8, seed=2),
        only(temperature=1.0, min_p=0.05, seed=3),
        only(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=4),
    ],
)
def test_sampled_distribution_matches_the_chain(runtime, params: p.Sampling) -> None:
    """Many draws from one logits row: both samplers' frequencies agree (total variation);
    with a top-k, so do draws from the row's top 64 candidates (what backend-topk gets from
    the device)."""
    runtime.seq_clear(0)
    tokens = runtime.tokenize("Once upon a time, in a small village, there lived a")
    rc, rows = runtime.decode([Span(0, 0, tokens, True)])
    row = np.array(runtime.logits_row(rows[0]))
    n = 3000
    state = SamplerState(params, 0)
    mine = [host_token(state, row.copy()) for _ in range(n)]
    top = np.argpartition(row, -64)[-64:]
    np.random.default_rng(0).shuffle(top)  # the device's candidates come unsorted
    state_c = SamplerState(params, 0)
    mine_c = [candidates(state_c, top, row[top]) for _ in range(n)] if params.top_k else []
    theirs = []
    for i in range(n):
        oracle = chain(runtime, msgspec.structs.replace(params, seed=1000 + i))
        theirs.append(oracle.sample(runtime.ctx, rows[0]))
        oracle.free()
    support = sorted(set(mine) | set(theirs))
    p = np.array([mine.count(t) for t in support]) / n
    q = np.array([theirs.count(t) for t in support]) / n
    assert len(set(mine)) > 1  # really sampling
    assert 0.5 * np.abs(p - q).sum() < 0.08, (support[:10], p[:10], q[:10])
    if mine_c:
        support = sorted(set(mine_c) | set(theirs))
        pc = np.array([mine_c.count(t) for t in support]) / n
        qc = np.array([theirs.count(t) for t in support]) / n
        assert 0.5 * np.abs(pc - qc).sum() < 0.08, (support[:10], pc[:10], qc[:10])


NUMBERS = r"""root ::= "[" [0-9]+ ("," " "? [0-9]+)* "]"
"""


@pytest.mark.parametrize("policy", ["", "qos,spec,latency,bmt"])
def test_daemon_tokens_same_from_either_source_of_candidates(tmp_path, policy: str) -> None:
    """Two fresh daemons, one sampling whole logits rows on the host (--sampler numpy), one
    the device's top-64 (backend-topk: here the CPU backend's graph), fed the same requests in
    the same order (so their KV caches hold the same cells: llama.cpp's logits depend slightly
    on the cache layout, which would flip near-tie tokens between differently used daemons):
    the same text, greedy, penalised (backend-topk's whole-row path, the sequence's device
    top-k detached) and constrained by a grammar (its wider device top-k searched where the
    grammar refuses the model's draw), greedy and sampled; seeded sampled (one chain over either
    candidates), and with speculative verification (several rows of one sequence in a tick,
    on the repetitive prompt); and the same log-probabilities (a whole row the device hands
    over)."""
    flags = ("--n-ctx", "2048", "--prefix-cache-tokens", "0", "--policy", policy)
    daemons = []
    try:
        for kind in ("numpy", "backend-topk"):
            (tmp_path / kind).mkdir()
            daemons.append(start_daemon(tmp_path / kind, "--sampler", kind, *flags))
        requests = [
            gen("The three laws of motion", max_tokens=24, repeat_penalty=1.2),
            gen("def fibonacci(n):", max_tokens=24, temperature=0.0, ignore_eos=True),
            gen("Once upon a time,", max_tokens=24, temperature=0.8, top_k=40, seed=11),
            gen("a b c d a b c d a b c d a b c d a b", max_tokens=24, temperature=0.0),
            # a grammar's row: the device's top GRAMMAR_TOP_K where its top-k was, searched
            # where the grammar refuses the draw, as the host searches the whole row
            gen("A list of numbers:", max_tokens=24, temperature=0.0, grammar=NUMBERS),
            gen("A list of numbers:", max_tokens=32, temperature=0.8, seed=5, grammar=NUMBERS),
        ]
        for req in requests:
            texts = []
            for d in daemons:
                with d.client() as c:
                    done = c.complete(msgspec.structs.replace(req, id=new_id(), stream=False))
                    texts.append(done.text)
            assert texts[0] == texts[1], (req.prompt, texts)
            assert texts[0]
        # a whole row from the device (its whole-row sampler doubles it, the host halves it)
        logprobs = []
        for d in daemons:
            with d.client() as c:
                req = gen("The capital of France is", max_tokens=4, temperature=0.0, logprobs=3)
                done = c.complete(msgspec.structs.replace(req, stream=False))
                assert isinstance(done, p.CompletionEvent) and done.logprobs
                logprobs.append([t.logprob for x in done.logprobs for t in [x.token, *x.top]])
        assert np.allclose(logprobs[0], logprobs[1], atol=0.02), logprobs
    finally:
        for d in daemons:
            d.stop()


def test_device_candidates_of_many_rows_read_at_once_equal_row_by_row() -> None:
    """The runtime reads 12 or more rows' device top-k as one gather from llama.cpp's buffer;
    each row must hold what llama.cpp's per-row accessors give, also after a sequence that
    asks for logits on several tokens (a drafted decode), one without any output row, and
    with rows asked out of order and one left out; and tick after tick, as the gather's views
    on that buffer are kept while it stays where it is and made again when it changes. Fewer
    rows are read row by row. Either way a layout's first read learns where the logits lie
    from llama.cpp's accessors; later reads of it call only the candidates' accessor."""
    import llama_cpp as ll

    from uma_serve.core.runtime import candidates as cand
    from uma_serve.core.runtime.candidates import BULK_ROWS

    calls: list[str] = []
    real = {name: getattr(cand, name) for name in ("_count_ith", "_logits_ith")}

    def counted(name: str):
        def call(*args):
            calls.append(name)
            return real[name](*args)

        return call

    n_seq = BULK_ROWS + 4
    rt = Runtime(RuntimeParams(default_model_path(), n_ctx=2048, n_seq=n_seq, device_top_k=64))
    try:

        def layout(ends: list[int], n_out: int, tick: int) -> list[Span]:
            spans = [Span(s, ends[s], [100 + 7 * s + tick], True) for s in range(n_seq)]
            ids = [50 + j for j in range(n_out)]  # n_out output rows
            spans[3] = Span(3, ends[3], ids, True, all_logits=True)
            spans[5] = Span(5, ends[5], [60 + tick], False)  # no output row
            return spans

        ends, views = [0] * n_seq, []
        # the same layout twice (the views kept), then more output rows (new views)
        for tick, n_out in enumerate((4, 4, 8)):
            spans = layout(ends, n_out, tick)
            rc, rows = rt.decode(spans)
            assert rc == 0
            rt.synchronize()
            # not every output row: a row's place in llama.cpp's buffer is not its place here
            wanted = [r for r in rows if r >= 0] + [rows[3] + j for j in (n_out - 1, n_out - 2)]
            assert len(wanted) >= BULK_ROWS
            assert (
                rt._candidates.buffers(rt.ctx, wanted, rt._batch) is not None
            )  # the gather, not the fallback
            views.append(rt._candidates._views[0])
            few = [wanted[0], wanted[-1], wanted[4]]  # read row by row
            rt._candidates._offsets.clear()  # learned by the gather, or (tick 1) row by row
            for name in real:
                setattr(cand, name, counted(name))
            try:
                if tick == 1:
                    first = [a.copy() for a in rt.candidates(few)]
                ids, logits = (a.copy() for a in rt.candidates(wanted))
                if tick != 1:
                    first = [a.copy() for a in rt.candidates(few)]
                assert calls  # the first read of the layout asked the accessors
                calls.clear()
                again = [a.copy() for a in rt.candidates(few)]
                assert [a.copy() for a in rt.candidates(wanted)][1].tolist() == logits.tolist()
                assert not calls, calls  # later reads: the candidates' accessor only
                assert all((x == y).all() for x, y in zip(first, again, strict=True))
            finally:
                for name, fn in real.items():
                    setattr(cand, name, fn)
            for j, row in enumerate(few):
                i = wanted.index(row)
                assert (first[0][j] == ids[i]).all() and (first[1][j] == logits[i]).all()
            for i, row in enumerate(wanted):
                n = ll.llama_get_sampled_candidates_count_ith(rt.ctx, row)
                assert n == 64
                their_ids = ll.llama_get_sampled_candidates_ith(rt.ctx, row)
                their_logits = ll.llama_get_sampled_logits_ith(rt.ctx, row)
                theirs_ids = np.ctypeslib.as_array(their_ids, (n,))
                theirs = np.ctypeslib.as_array(their_logits, (n,))
                assert (ids[i] == theirs_ids).all() and (logits[i] == theirs).all(), (tick, row)
            ends = [sp.pos + len(sp.tokens) for sp in spans]
        assert views[1] == views[0] and views[2] != views[1]
    finally:
        rt.close()


def test_a_decode_s_every_row_read_in_order_is_one_gather_by_slices() -> None:
    """A decode's rows, each one token with its output, read all and in order (every tick of
    plain decoding): the gather takes them as slices of llama.cpp's buffer, with no output
    index computed (its numpy costs ~110 us right after a decode), and each row holds what
    llama.cpp's per-row accessors give, tick after tick, also beside a prompt chunk whose last
    token has the output (a conversation's turn joining the decodes)."""

    from uma_serve.core.runtime import candidates as cand
    from uma_serve.core.runtime.candidates import BULK_ROWS

    def no_index(*args):
        raise AssertionError("the rows' output indices were computed")

    n_seq = BULK_ROWS + 3
    rt = Runtime(RuntimeParams(default_model_path(), n_ctx=2048, n_seq=n_seq, device_top_k=64))
    looked_up: list[int] = []
    real_ith = cand._candidates_ith

    def counted(ctx, row):
        looked_up.append(row)
        return real_ith(ctx, row)

    real, cand._output_rows = cand._output_rows, no_index
    cand._candidates_ith = counted
    try:
        ends = [0] * n_seq
        for tick in range(4):
            spans = [Span(s, ends[s], [100 + 7 * s + tick], True) for s in range(n_seq)]
            if tick == 3:  # a turn that re-sends its history: a prompt chunk, its last row out
                spans[2] = Span(2, ends[2], [60 + j for j in range(5)], True)
            rc, rows = rt.decode(spans)
            assert rc == 0 and rows == [i + 4 * (tick == 3 and i > 1) for i in range(n_seq)]
            rt.synchronize()
            ends = [sp.pos + len(sp.tokens) for sp in spans]
            looked_up.clear()
            ids, logits = (a.copy() for a in rt.candidates(rows))
            assert looked_up == [rows[0], rows[-1]]  # one gather, not row by row
            for i, row in enumerate(rows):
                theirs_ids, theirs = _theirs(rt, row, 64)
                assert (ids[i] == theirs_ids).all() and (logits[i] == theirs).all(), (tick, row)
    finally:
        cand._output_rows, cand._candidates_ith = real, real_ith
        rt.close()


def test_a_tick_of_decodes_alone_reads_any_of_its_rows_with_no_output_index() -> None:
    """A tick of decodes alone has an output at every batch row, so a row's place among the
    outputs is the row itself: a part of its rows (a grammar's row read apart, wider) is read
    with no output index computed (a numpy call costs ~50 us right after a decode), and holds
    what llama.cpp's accessors give; beside a prompt chunk the indices are computed."""
    import llama_cpp as ll

    from uma_serve.core.runtime import candidates as cand
    from uma_serve.core.runtime.candidates import BULK_ROWS

    computed: list[int] = []
    real = cand._output_rows

    def indexed(rows, outputs):
        if not chunk:
            raise AssertionError("the rows' output indices were computed")
        computed.append(len(rows))
        return real(rows, outputs)

    n_seq, wide_k = BULK_ROWS + 3, 1024
    wide = n_seq - 1  # a grammar's sequence: a wider device top-k, read apart
    rt = Runtime(RuntimeParams(default_model_path(), n_ctx=2048, n_seq=n_seq, device_top_k=64))
    cand._output_rows = indexed
    try:
        rt.set_device_chain(wide, wide_k)
        ends = [0] * n_seq
        for tick in range(4):
            chunk = tick == 2
            spans = [Span(s, ends[s], [100 + 7 * s + tick], True) for s in range(n_seq)]
            if chunk:  # a conversation's turn: a prompt chunk among the decodes
                spans[0] = Span(0, ends[0], [60 + j for j in range(5)], True)
            rc, rows = rt.decode(spans)
            assert rc == 0 and rt.synchronize() == 0
            ends = [sp.pos + len(sp.tokens) for sp in spans]
            part = [rows[s] for s in range(wide) if s != 1]  # a gather, not every row
            for some in (part, part[:3]):  # a gather; row by row
                ids, logits = (a.copy() for a in rt.candidates(some))
                for i, row in enumerate(some):
                    assert ll.llama_get_sampled_candidates_count_ith(rt.ctx, row) == 64
                    theirs_ids, theirs = _theirs(rt, row, 64)
                    assert (ids[i] == theirs_ids).all() and (logits[i] == theirs).all(), (tick, row)
            assert ll.llama_get_sampled_candidates_count_ith(rt.ctx, rows[wide]) == wide_k
            ids, logits = rt.wide_candidates(rows[wide], wide_k)
            theirs_ids, theirs = _theirs(rt, rows[wide], wide_k)
            assert (ids == theirs_ids).all() and (logits == theirs).all()
            assert bool(computed) == chunk, tick
            computed.clear()
    finally:
        cand._output_rows = real
        rt.close()


def _theirs(rt: Runtime, row: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A row's ``k`` device candidates, ids and logits, through llama.cpp's own accessors."""
    import llama_cpp as ll

    ids = np.ctypeslib.as_array(ll.llama_get_sampled_candidates_ith(rt.ctx, row), (k,))
    logits = np.ctypeslib.as_array(ll.llama_get_sampled_logits_ith(rt.ctx, row), (k,))
    return ids.copy(), logits.copy()


def test_a_detached_sequence_hands_over_its_whole_row_and_only_it() -> None:
    """A request that needs its whole logits row (a grammar, penalties, logprobs) has its
    sequence's device top-k detached. Its row must be the model's whole row, as a runtime
    without device top-k gives it, and the decode's other rows must stay on the device:
    llama.cpp copies every output row to the host when a sequence has no device sampler,
    which cost 3 streams beside one such request an eighth of their speed on an H100."""
    import llama_cpp as ll

    n_seq, detached = 4, 1
    params = RuntimeParams(default_model_path(), n_ctx=1024, n_seq=n_seq, device_top_k=64)
    rt, plain = Runtime(params), Runtime(dataclasses.replace(params, device_top_k=0))
    try:
        rt.set_device_chain(detached, 0)
        raw = np.ctypeslib.as_array(ll.llama_get_logits(rt.ctx), shape=(n_seq * rt.n_vocab,))
        ends = [0] * n_seq
        for tick in range(3):
            spans = [Span(s, ends[s], [2, 100 + s] if tick == 0 else [300 + 7 * s + tick], True)
                     for s in range(n_seq)]  # fmt: skip
            raw[:] = np.nan  # llama.cpp's buffer of whole rows, as the last decode left it
            rc, out = rt.decode(spans)
            assert rc == 0 and rt.synchronize() == 0
            assert plain.decode(spans) == (0, out) and plain.synchronize() == 0
            ends = [sp.pos + len(sp.tokens) for sp in spans]
            whole = rt.logits_row(out[detached])
            assert whole.shape == (rt.n_vocab,)
            assert np.allclose(whole, plain.logits_row(out[detached]), atol=1e-3), tick
            assert np.isnan(raw).all(), f"tick {tick}: whole rows crossed to the host"
            ids, _ = rt.candidates([out[s] for s in range(n_seq) if s != detached])
            assert (ids >= 0).all()
        rt.set_device_chain(detached, 64)  # re-attached: its row is a top-k again
        spans = [Span(s, ends[s], [400 + s], True) for s in range(n_seq)]
        assert rt.decode(spans)[0] == 0 and rt.synchronize() == 0
        assert ll.llama_get_sampled_candidates_count_ith(rt.ctx, detached) == 64
        assert ll.llama_get_sampled_logits_count_ith(rt.ctx, detached) == 64
        # a grammar's wider top-k: read whole, the row's best tokens with their logits, as a
        # runtime without device top-k has them
        assert plain.decode(spans)[0] == 0 and plain.synchronize() == 0
        ends = [sp.pos + len(sp.tokens) for sp in spans]
        rt.set_device_chain(detached, GRAMMAR_TOP_K)
        spans = [Span(s, ends[s], [500 + s], True) for s in range(n_seq)]
        rc, out = rt.decode(spans)
        assert rc == 0 and rt.synchronize() == 0 and plain.decode(spans) == (0, out)
        _assert_best_of(rt.wide_candidates(out[detached], GRAMMAR_TOP_K),
                        plain.logits_row(out[detached]), GRAMMAR_TOP_K)  # fmt: skip
    finally:
        rt.close()
        plain.close()


def _assert_best_of(wide: tuple[np.ndarray, np.ndarray], row: np.ndarray, n: int) -> None:
    """``wide`` holds ``n`` distinct tokens, the row's best, with their logits."""
    ids, logits = wide
    assert len(ids) == n and len(set(ids.tolist())) == n
    assert np.allclose(logits, row[ids], atol=1e-3)
    assert np.allclose(np.sort(logits), np.sort(row)[-n:], atol=1e-3)


def test_a_device_top_k_wider_than_the_vocabulary_hands_over_all_of_it() -> None:
    """A model whose vocabulary is smaller than a grammar's top-k (SmolLM2's 49,152 here,
    against a top-k asked of 60,000): llama.cpp would abort building the graph; the runtime
    asks for the whole vocabulary instead, and reads all of it."""
    from uma_serve.core.config import chat_model_path

    params = RuntimeParams(chat_model_path(), n_ctx=512, n_seq=2, device_top_k=64)
    rt, plain = Runtime(params), Runtime(dataclasses.replace(params, device_top_k=0))
    try:
        rt.set_device_chain(1, rt.n_vocab + 10_848)
        spans = [Span(0, 0, [1, 100], True), Span(1, 0, [1, 200], True)]
        rc, out = rt.decode(spans)
        assert rc == 0 and rt.synchronize() == 0 and plain.decode(spans) == (0, out)
        wide = rt.wide_candidates(out[1], rt.n_vocab + 10_848)
        _assert_best_of(wide, plain.logits_row(out[1]), rt.n_vocab)
    finally:
        rt.close()
        plain.close()
