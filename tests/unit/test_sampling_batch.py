"""Drawing a tick's rows together (backend-topk's candidates) against one row at a time and
against the whole-row sampler: the same token for the same seed, row by row."""

from __future__ import annotations

import numpy as np
import pytest

from uma_serve.core.runtime import SamplingParams
from uma_serve.core.sampling import TokenSampler, sample_candidates_batch

K = 64
PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1),
    SamplingParams(temperature=1.2, top_k=64, top_p=0.9, seed=2),
    SamplingParams(temperature=0.5, top_k=10, seed=3),
    SamplingParams(temperature=1.0, top_k=64, min_p=0.2, seed=4),
    SamplingParams(temperature=0.7, top_k=1, seed=5),
]


def _rows(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n rows of K device candidates: distinct ids, unsorted logits."""
    ids = np.stack([rng.choice(262_144, K, replace=False) for _ in range(n)]).astype(np.int32)
    return ids, (rng.standard_normal((n, K)) * 3).astype(np.float32)


def test_a_batch_draws_what_each_row_draws_alone() -> None:
    """Rows with different parameters side by side do not leak into one another: every row
    gets the token its sampler draws alone (the one-row code, written apart), tick after tick
    (each sampler's RNG advances once per token in both)."""
    rng = np.random.default_rng(7)
    together = [TokenSampler(p, 0) for p in PARAMS]
    alone = [TokenSampler(p, 0) for p in PARAMS]
    for _ in range(200):
        ids, logits = _rows(rng, len(PARAMS))
        batch = sample_candidates_batch(together, ids, logits)
        single = [s.sample_candidates(ids[i], logits[i]) for i, s in enumerate(alone)]
        assert batch == single
    assert len(set(together[2].history)) > 1  # really sampling


@pytest.mark.parametrize("params", [p for p in PARAMS if p.top_p < 1.0 or p.temperature == 0])
def test_candidates_draw_what_the_whole_row_draws(params: SamplingParams) -> None:
    """With the whole vocabulary as candidates (a K-token vocabulary), the batched draw and
    the whole-row sampler (its own top-k, top-p and min-p code) pick the same token for the
    same seed."""
    rng = np.random.default_rng(11)
    batched = [TokenSampler(params, 0), TokenSampler(params, 0)]  # two rows: the batch path
    whole = TokenSampler(params, 0)
    picks = []
    for _ in range(300):
        logits = (rng.standard_normal(K) * 3).astype(np.float32)
        ids = np.arange(K, dtype=np.int32)
        order = rng.permutation(K)  # the device's candidates come unsorted
        rows = np.stack([ids[order]] * 2), np.stack([logits[order]] * 2)
        picks.append(sample_candidates_batch(batched, *rows)[0])
        assert picks[-1] == whole.sample(logits.copy())
    if params.temperature > 0:
        assert len(set(picks)) > 10


def test_greedy_takes_the_lowest_id_on_a_tie_and_ignores_padding() -> None:
    ids = np.array([[9, 4, 7, 0], [3, 8, 1, 2]], dtype=np.int32)
    logits = np.array([[1.0, 2.0, 2.0, -np.inf], [-np.inf, 0.5, -np.inf, -np.inf]], np.float32)
    samplers = [TokenSampler(SamplingParams(temperature=0.0), 0) for _ in range(2)]
    assert sample_candidates_batch(samplers, ids, logits) == [4, 8]
    drawn = TokenSampler(SamplingParams(temperature=1.0, top_k=4, seed=0), 0)
    assert {sample_candidates_batch([drawn], ids[1:], logits[1:])[0] for _ in range(50)} == {8}
