"""The one sampling chain (core/sampling.py): rows drawn together as each alone, a host row
cut to its candidates as the device's candidates, and the law a textbook chain gives."""

from __future__ import annotations

import math

import numpy as np
import pytest
from host_row import only

from uma_serve.core.draw import Candidates, draw, stack
from uma_serve.core.protocol import Sampling
from uma_serve.core.sampling import GRAMMAR_TOP_K, UNIFORM_BATCH, SamplerState, needs_full_row

K = 64
PARAMS = [
    only(temperature=0.0),
    only(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1),
    only(temperature=1.2, top_k=64, top_p=0.9, seed=2),
    only(temperature=0.5, top_k=10, seed=3),
    only(temperature=1.0, top_k=64, min_p=0.2, seed=4),
    only(temperature=0.7, top_k=1, seed=5),
    only(temperature=0.9, top_p=0.8, seed=6),
    only(temperature=1.0, seed=7),
]


def _rows(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n rows of K device candidates: distinct ids, unsorted logits."""
    ids = np.stack([rng.choice(262_144, K, replace=False) for _ in range(n)]).astype(np.int32)
    return ids, (rng.standard_normal((n, K)) * 3).astype(np.float32)


def _host(state: SamplerState, row: np.ndarray) -> int:
    """One whole host row through the chain, as the engine's sampler does it."""
    state.prepare(row)
    token = draw([state], *stack([state.cut(row)]))[0]
    state.accept(token)
    return token


def test_a_batch_draws_what_each_row_draws_alone() -> None:
    """Rows with different parameters side by side do not leak into one another: every row
    gets the token it draws alone, tick after tick (each RNG advances once per token)."""
    rng = np.random.default_rng(7)
    together = [SamplerState(p, 0) for p in PARAMS]
    alone = [SamplerState(p, 0) for p in PARAMS]
    for _ in range(200):
        ids, logits = _rows(rng, len(PARAMS))
        batch = draw(together, ids, logits)
        single = [draw([s], ids[i : i + 1], logits[i : i + 1])[0] for i, s in enumerate(alone)]
        assert batch == single
    assert len({draw([together[2]], *_rows(rng, 1))[0] for _ in range(50)}) > 1


@pytest.mark.parametrize("params", [p for p in PARAMS if not needs_full_row(p, K)])
def test_a_host_row_cut_to_candidates_draws_what_the_device_candidates_draw(
    params: Sampling,
) -> None:
    """A whole row on the host (cut to its argmax, top-k or nucleus first) and the same row
    handed over as unsorted device candidates pick the same token for the same seed."""
    rng = np.random.default_rng(11)
    host, device = SamplerState(params, 0), SamplerState(params, 0)
    picks = []
    for _ in range(300):
        logits = (rng.standard_normal(K) * 3).astype(np.float32)
        order = rng.permutation(K)  # the device's candidates come unsorted
        ids = np.arange(K, dtype=np.int32)[order][None]
        picks.append(draw([device], ids, logits[order][None])[0])
        assert picks[-1] == _host(host, logits.copy())
    if params.temperature > 0 and params.top_k != 1:
        assert len(set(picks)) > 5


def test_a_nucleus_cut_from_a_wide_row_keeps_the_rows_law() -> None:
    """top-p without top-k on a 262,144-token row: the cut keeps only the tokens near the
    peak and carries the rest's mass, so every draw equals the draw over the whole row."""
    rng = np.random.default_rng(3)
    params = only(temperature=1.0, top_p=0.9, seed=9)
    cut, whole = SamplerState(params, 0), SamplerState(params, 0)
    for _ in range(40):
        row = rng.standard_normal(262_144).astype(np.float32)
        row[rng.choice(262_144, 5)] += 16.0  # a few likely tokens
        c = cut.cut(row)
        assert len(c.ids) < 1000 and c.rest > 0
        everything = Candidates(np.arange(len(row)), row)  # the same chain, sorted, uncut
        assert draw([cut], *stack([c])) == draw([whole], *stack([everything]))


def _textbook(logits: np.ndarray, p: Sampling) -> np.ndarray:
    """llama.cpp's chain written the plain way: the probability of each token."""
    order = np.argsort(-logits, kind="stable")
    x = logits[order].astype(np.float64)
    n = len(x) if p.top_k <= 0 else min(p.top_k, len(x))
    x = x[:n]
    probs = np.exp(x - x[0]) / np.exp(x - x[0]).sum()
    if p.top_p < 1.0:
        n = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        x = x[:n]
    if p.min_p > 0.0:
        x = x[x >= x[0] + np.log(p.min_p)]
    w = np.exp((x - x[0]) / p.temperature)
    out = np.zeros(len(logits))
    out[order[: len(x)]] = w / w.sum()
    return out


@pytest.mark.parametrize("params", [p for p in PARAMS if p.temperature > 0 and p.top_k != 1])
def test_the_draws_follow_the_textbook_chains_law(params: Sampling) -> None:
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(K) * 1.5).astype(np.float32)
    state = SamplerState(params, 0)
    n = 20_000
    ids = np.arange(K, dtype=np.int32)[None].repeat(n, axis=0)
    drawn = draw([state] * n, ids, np.repeat(logits[None], n, axis=0))
    freq = np.bincount(drawn, minlength=K) / n
    assert 0.5 * np.abs(freq - _textbook(logits, params)).sum() < 0.03


def test_greedy_takes_the_lowest_id_on_a_tie_and_ignores_padding() -> None:
    ids = np.array([[9, 4, 7, 0], [3, 8, 1, 2]], dtype=np.int32)
    logits = np.array([[1.0, 2.0, 2.0, -np.inf], [-np.inf, 0.5, -np.inf, -np.inf]], np.float32)
    states = [SamplerState(only(temperature=0.0), 0) for _ in range(2)]
    assert draw(states, ids, logits) == [4, 8]
    drawn = SamplerState(only(temperature=1.0, top_k=4, seed=0), 0)
    assert {draw([drawn], ids[1:], logits[1:])[0] for _ in range(50)} == {8}


def test_bias_and_penalties_change_the_row_before_the_cut() -> None:
    row = np.zeros(K, dtype=np.float32)
    row[3] = 5.0
    biased = SamplerState(only(temperature=0.0, logit_bias={3: -10.0, 7: 1.0}), 0)
    assert _host(biased, row.copy()) == 7
    penalized = SamplerState(only(temperature=0.0, presence_penalty=6.0), 0)
    assert _host(penalized, row.copy()) == 3  # no history yet
    assert _host(penalized, row.copy()) == 0  # token 3 now 5 - 6 < 0: the lowest id at 0 wins


class _DeviceTopK:
    """What the sampler asks of a runtime with a device top-k: the (de)tach calls, recorded."""

    params = type("Params", (), {"device_top_k": K})()

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []

    def set_device_chain(self, seq_id: int, k: int) -> None:
        self.calls.append((seq_id, k == K))


def test_each_request_gets_the_device_chain_its_draw_needs() -> None:
    """Plain requests the device's top-k; a grammar's request the wider GRAMMAR_TOP_K, greedy
    or with min-p (its search stays among them); its whole row where it samples without
    min-p or top-k, or needs logprobs, penalties or a bias, as any such request does."""
    from uma_serve.core import protocol as p
    from uma_serve.core.sampling import GRAMMAR_TOP_K, device_chain

    def chain(**fields) -> int:
        return device_chain(p.Generate(id="a", prompt="x", **fields), K)

    g = "root ::= [0-9]+"
    assert chain() == K and chain(temperature=0.0, top_k=0) == K
    assert chain(grammar=g) == GRAMMAR_TOP_K
    assert chain(grammar=g, temperature=0.0, min_p=0.0, top_k=0) == GRAMMAR_TOP_K
    assert chain(grammar=g, top_k=K + 1) == GRAMMAR_TOP_K and chain(top_k=K + 1) == 0
    for whole in (dict(min_p=0.0), dict(top_k=0), dict(logprobs=1), dict(repeat_penalty=1.1),
                  dict(logit_bias={5: 1.0})):  # fmt: skip
        assert chain(grammar=g, **whole) == 0, whole


def test_a_detached_sequence_stays_detached_until_a_request_can_use_the_device() -> None:
    """Each (de)tach costs a graph reservation: constrained requests one after another on one
    sequence id detach it once; a plain request there attaches it again, once. The changes
    wait for ``apply`` (the scheduler's, before a launch: a tick may be computing with the
    id's chain), and a change undone before it costs nothing."""
    from uma_serve.core import protocol as p
    from uma_serve.core.sampling import Sampler

    runtime = _DeviceTopK()
    sampler = Sampler(runtime)  # type: ignore[arg-type]
    penalised = p.Generate(id="a", prompt="x", repeat_penalty=1.2)
    plain = p.Generate(id="b", prompt="x")
    for _ in range(3):
        sampler.release(sampler.new(5, penalised, 0))
        assert runtime.calls == []  # not before apply
    sampler.apply()
    assert runtime.calls == [(5, False)]
    assert sampler.new(5, plain, 0).device_k == K
    sampler.apply()
    assert runtime.calls[-1] == (5, True)
    sampler.new(6, plain, 0)
    sampler.apply()
    assert len(runtime.calls) == 2  # an attached id stays as it is
    assert sampler.new(6, p.Generate(id="c", prompt="x", logprobs=2), 0).device_k == 0
    sampler.apply()
    assert runtime.calls[-1] == (6, False)
    sampler.new(7, penalised, 0)
    sampler.new(7, plain, 0)  # detached, then attached again, before any launch
    sampler.apply()
    assert len(runtime.calls) == 3 and 7 not in sampler.chains


def test_admission_gives_a_request_an_id_that_needs_no_switch() -> None:
    """Plain and whole-row requests alternating over eight ids switch a device top-k once
    (the first constrained request's), not at every change of kind: each request is given a
    free id already in the state it needs."""
    from uma_serve.core import protocol as p
    from uma_serve.core.engine.sequence import Sequence
    from uma_serve.core.engine.waiting import WaitingQueue
    from uma_serve.core.sampling import Sampler

    runtime = _DeviceTopK()
    sampler = Sampler(runtime)  # type: ignore[arg-type]
    queue = WaitingQueue(range(8), 0)  # four streams on eight sequences
    plain = p.Generate(id="a", prompt="x")
    constrained = p.Generate(id="b", prompt="x", repeat_penalty=1.2)  # its whole row
    for k in range(6):  # three plain streams and one more, plain or not, ended and restarted
        running = []
        for req in (plain, plain, plain, constrained if k % 2 else plain):
            queue.waiting.append(Sequence((1, req.id), req, [1, 2], 0))
            seq = queue.admit(None, lambda s: sampler.suits(s.request))
            assert seq is not None
            running.append((seq, sampler.new(seq.seq_id, req, 0)))
        sampler.apply()
        for seq, state in running:
            assert (state.device_k == 0) == (seq.request is constrained)
            sampler.release(state)
            queue.release(seq.seq_id)
    assert len(runtime.calls) == 1 and runtime.calls[0][1] is False, runtime.calls


class _Fixed:
    """A row's chain with given uniforms: the draw's arithmetic, checked against a plain one."""

    def __init__(self, chain: tuple[float, float, float, float], uniforms: list[float]) -> None:
        self.chain, self._uniforms = chain, uniforms[::-1]

    def uniform(self) -> float:
        return self._uniforms.pop()


def _plain_draw(ids: np.ndarray, logits: np.ndarray, chain: tuple, u: float, rest: float) -> int:
    """The chain written the plain way: a stable sort by logit (ties in column order, -0 as
    +0), top-k, min-p, top-p over the top-k's mass and the rest, then the inverse CDF."""
    top_k, log_min_p, top_p, temperature = chain
    order = np.argsort(-logits.astype(np.float64), kind="stable")
    x = logits[order[: int(min(top_k, len(order)))]].astype(np.float64) - float(logits.max())
    n = int(np.count_nonzero(x >= log_min_p))
    if top_p < 1.0:
        mass = np.cumsum(np.exp(x))
        n = min(n, int(np.count_nonzero(mass < top_p * (mass[-1] + rest))) + 1)
    cw = np.cumsum(np.exp(x[:n] / temperature))
    return int(ids[order[min(int(np.count_nonzero(cw <= u * cw[-1])), n - 1)]])


def test_the_sorted_draw_is_the_plain_chains_arithmetic() -> None:
    """draw.c against the chain written with numpy, row by row and together: ties (in column
    order, not by id), -0 beside +0, -inf padding, every step of the chain, rest mass; rows of
    the device's 64 candidates and as wide as a grammar's (GRAMMAR_TOP_K), whose top-k draw.c
    keeps in a heap rather than sorting the row (so does a top-k under a quarter of 64)."""
    rng = np.random.default_rng(0)
    chains = [(math.inf, -math.inf, 1.0, 0.8), (40, math.log(0.05), 0.95, 0.8),
              (10, -math.inf, 1.0, 0.5), (math.inf, math.log(0.2), 0.9, 1.3),
              (1, -math.inf, 1.0, 1.0), (64, -math.inf, 0.5, 2.0)]  # fmt: skip
    for width, rows, times in ((K, 1, 40), (K, 3, 40), (K, 16, 40), (GRAMMAR_TOP_K, 2, 12)):
        for _ in range(times):
            ids = np.stack([rng.permutation(262_144)[:width] for _ in range(rows)])
            ids = ids.astype(np.int32)
            x = (rng.standard_normal((rows, width)) * 2).astype(np.float32)
            x[rng.random((rows, width)) < 0.3] = np.float32(1.5)  # ties
            peaks = rng.random((rows, width)) < 20 / width
            x = np.where(peaks, x.max(axis=1, keepdims=True), x)  # ties at the peak
            x[:, 5], x[:, 6], x[:, width - 3 :] = -0.0, 0.0, -np.inf
            picked = [chains[i] for i in rng.integers(len(chains), size=rows)]
            us, rest = rng.random(rows).tolist(), rng.random(rows) * 3
            got = draw([_Fixed(c, [u]) for c, u in zip(picked, us, strict=True)], ids, x, rest)
            want = [
                _plain_draw(ids[r], x[r], picked[r], us[r], float(rest[r])) for r in range(rows)
            ]
            assert got == want


def test_a_row_without_a_finite_peak_draws_as_in_a_batch() -> None:
    """A row whose logits hold a NaN or an infinity (random weights overflow) gives a token,
    drawn one by one as together with other rows, instead of failing the tick."""
    rng = np.random.default_rng(3)
    ids, logits = _rows(rng, 4)
    logits[0, :] = np.nan
    logits[1, 5] = np.inf
    logits[2, :] = -np.inf
    params = only(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1)
    with np.errstate(invalid="ignore"):  # inf - inf: the NaNs the row's maths then meets
        together = draw([SamplerState(params, 0) for _ in range(4)], ids, logits)
        alone = [draw([SamplerState(params, 0)], ids[i : i + 1], logits[i : i + 1])[0]
                 for i in range(4)]  # fmt: skip
    assert together == alone


def test_a_sequences_draws_are_its_rngs_stream_across_refills() -> None:
    """The uniforms made UNIFORM_BATCH at a time are the stream of one ``random()`` a token,
    so a seed gives the same tokens whatever the batching."""
    state = SamplerState(Sampling(seed=42), 0)
    reference = np.random.Generator(np.random.PCG64(42))
    n = 3 * UNIFORM_BATCH + 5
    assert [state.uniform() for _ in range(n)] == [reference.random() for _ in range(n)]


@pytest.mark.parametrize("rows", [1, 2, 5, 20])  # one by one, batched, a large tick's sort
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_nan_logit_is_never_drawn_and_its_row_draws_as_alone(
    rows: int, temperature: float
) -> None:
    """A NaN logit (a model whose arithmetic overflowed) counts as -inf: the token is one of
    the row's candidates (an id outside the vocabulary would abort llama.cpp, and the
    daemon with it), never the NaN's while the row holds a number; each row draws as alone,
    its RNG stream kept (a second draw agrees too)."""
    rng = np.random.default_rng(rows)
    ids, logits = _rows(rng, rows)
    top = logits.argmax(axis=1)
    logits[0, top[0]] = np.nan  # the row's best is a NaN
    if rows > 1:
        logits[1, :] = np.nan  # no number at all
    params = only(temperature=temperature, top_k=40, top_p=0.95, min_p=0.05, seed=1)
    together = [SamplerState(params, 0) for _ in range(rows)]
    alone = [SamplerState(params, 0) for _ in range(rows)]
    for _ in range(2):
        with np.errstate(invalid="ignore"):
            got = draw(together, ids, logits)
            want = [draw([alone[i]], ids[i : i + 1], logits[i : i + 1])[0] for i in range(rows)]
        assert got == want
        for i, token in enumerate(got):
            assert token in ids[i]
        assert got[0] != ids[0, top[0]]
        if temperature == 0.0:
            numbers = np.where(np.isnan(logits[0]), -np.inf, logits[0])
            assert got[0] == ids[0, numbers.argmax()]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_padded_host_row_of_nans_gives_one_of_its_candidates(temperature: float) -> None:
    """Host rows of different widths are padded (id NO_ID, logit -inf): a row whose logits
    are all NaN still gives one of its own ids, not the padding's."""
    params = only(temperature=temperature, top_k=40, top_p=0.95, min_p=0.05, seed=1)
    rows = [
        Candidates(np.arange(5), np.full(5, np.nan, dtype=np.float32)),
        Candidates(np.arange(10, 40), np.linspace(-1, 1, 30, dtype=np.float32)),
        Candidates(np.arange(100, 103), np.array([1.0, np.nan, 2.0], dtype=np.float32)),
    ]
    with np.errstate(invalid="ignore"):
        tokens = draw([SamplerState(params, 0) for _ in rows], *stack(rows))
    for token, row in zip(tokens, rows, strict=True):
        assert token in row.ids
    assert tokens[2] != 101


def test_a_greedy_host_row_with_a_nan_takes_its_largest_number() -> None:
    """numpy's argmax takes a NaN for the maximum: a whole row cut for a greedy request
    gives its largest number instead (and a row of NaNs its first token)."""
    row = np.random.default_rng(5).standard_normal(1000).astype(np.float32)
    best = int(row.argmax())
    row[best] = np.nan
    with np.errstate(invalid="ignore"):
        token = _host(SamplerState(only(temperature=0.0), 0), row.copy())
        assert token == int(np.where(np.isnan(row), -np.inf, row).argmax())
        assert _host(SamplerState(only(temperature=0.0), 0), np.full(1000, np.nan, np.float32)) == 0


def test_a_row_without_candidates_is_an_error_not_a_token() -> None:
    """draw.c reads a row's first candidate: an empty row raises instead (no id to give)."""
    with pytest.raises(ValueError, match="without candidates"):
        draw([SamplerState(only(temperature=0.8), 0)], np.zeros((1, 0), np.int32),
             np.zeros((1, 0), np.float32))  # fmt: skip
