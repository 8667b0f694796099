"""Prompt-lookup speculation on the engine's side (core/spec/drafts.py): pure proposals and
acceptance figures, and the scheduler keeping the agreeing run on a fake runtime."""

from __future__ import annotations

import threading

from hypothesis import given, strategies as st
from test_engine_tick import AllRows

from uma_serve.core import protocol as p
from uma_serve.core.engine import Engine, Submission
from uma_serve.core.policy import Constraints
from uma_serve.core.policy.pipeline import build_policy
from uma_serve.core.spec.drafts import acceptance, drafting, proposal, smoothed
from uma_serve.core.spec.ngram import NgramIndex


def test_a_proposal_stays_within_the_draft_the_tokens_left_and_the_context() -> None:
    ng = NgramIndex([1, 2, 3, 4, 5, 6, 7, 1, 2])
    assert proposal(ng, 4, tokens_left=100, cells_left=100) == (3, 4, 5, 6)
    assert proposal(ng, 4, tokens_left=3, cells_left=100) == (3, 4)  # one is the pending one
    assert proposal(ng, 4, tokens_left=100, cells_left=3) == (3,)
    assert proposal(ng, 4, tokens_left=1, cells_left=100) == ()
    assert proposal(None, 4, 100, 100) == ()
    assert drafting(2, max_streams=2) and not drafting(3, max_streams=2)


def test_acceptance_counts_the_one_rejection_and_is_smoothed() -> None:
    assert acceptance(3, 3) == 1.0  # all agreed: no rejection
    assert acceptance(1, 3) == 0.5
    assert acceptance(0, 2) == 0.0
    assert smoothed(0.7, 1.0) == 0.3 + 0.7 * 0.7


def test_drafts_that_agree_are_kept_and_the_output_is_plain_decodings() -> None:
    """The fake's rows continue 1, 2, ..., 10, 1, ...; the prompt holds that cycle, so its
    drafts agree: the tokens are those of plain decoding, fewer ticks carry them."""
    events: list[tuple[int, p.Event]] = []
    done = threading.Event()

    def sink(batch):
        events.extend(batch)
        if any(isinstance(e, p.EosEvent) for _, e in batch):
            done.set()

    c = Constraints(n_batch=64, tick_budget_ms=50.0, spec_max_draft=4, spec_max_streams=2)
    engine = Engine(AllRows(), build_policy(["spec"]), c, sink, seed=1)
    req = p.Generate(id="a", prompt="x", max_tokens=12, temperature=0.0, ignore_eos=True)
    prompt = [*range(1, 11), 1, 2, 3]
    engine.submit(Submission((1, "a"), req, prompt, 0))
    engine.start()
    assert done.wait(10), events
    engine.stop("test over")
    engine.join(5)
    tokens = [e.token_id for _, e in events if isinstance(e, p.TokenEvent)]
    assert tokens == [(13 + i) % 10 + 1 for i in range(12)]
    m = engine.metrics
    assert m.spec_drafted_tokens_total > 0
    assert m.spec_accepted_tokens_total == m.spec_drafted_tokens_total
    assert m.batch_calls_total < 12  # the prompt's tick and fewer than 11 decodes


@given(st.lists(st.integers(0, 4), max_size=80))
def test_an_index_built_from_a_prompt_is_the_one_appended_token_by_token(tokens: list[int]) -> None:
    """The bulk build (at admission) indexes exactly what appending each token would."""
    bulk, stepped = NgramIndex(tokens), NgramIndex()
    for t in tokens:
        stepped.append(t)
    assert (bulk.tokens, bulk._last, bulk._match) == (stepped.tokens, stepped._last, stepped._match)
    assert [bulk.draft(k) for k in (1, 4)] == [stepped.draft(k) for k in (1, 4)]
