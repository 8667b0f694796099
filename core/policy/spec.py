"""Speculative decoding by prompt lookup: drafts from the session's own tokens, no draft model.

``NgramIndex`` (kept per session by the engine) remembers, for each n-gram of the session's
prompt + output (n = ``NGRAM_MAX`` down to ``NGRAM_MIN``), where it last ended. After each
token it finds the most recent *earlier* occurrence of the longest suffix n-gram and proposes
the tokens that followed it. The engine shows that proposal in the SessionView (``draft``).

``SpeculativeDecode`` (the Plan transformer) decides whether and how much of it to verify:
only when few streams decode (``spec_max_streams``: with more, the batch already fills the
machine and extra rows cost more than they save), and as many tokens as the session's
acceptance EWMA earns. A session whose drafts are mostly rejected drafts only a probe now and
then. A decode item of ``n_tokens = 1 + k`` carries the pending token plus k drafted tokens, all
with logits; the engine samples row by row and keeps the agreeing run (exact: see engine).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from uma_serve.core.policy.state import Constraints, Phase, Plan, SchedulerState, views_by_seq

NGRAM_MAX = 3
NGRAM_MIN = 2
PROBE_EVERY = 8  # ticks between probes of a session whose acceptance is low
LOW_ACCEPTANCE = 0.25


class NgramIndex:
    """Most recent end position of every n-gram of a growing token list."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}
        self._match = -1  # where the earlier occurrence of the current suffix ended
        for t in tokens:
            self.append(t)

    def append(self, token: int) -> None:
        toks = self.tokens
        toks.append(token)
        end = len(toks)
        match = -1
        for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            if end < n:
                continue
            key = tuple(toks[end - n :])
            if match < 0:
                match = self._last.get(key, -1)
            self._last[key] = end
        self._match = match

    def draft(self, k: int) -> tuple[int, ...]:
        """Up to k tokens that followed the previous occurrence of the current suffix."""
        if self._match < 0 or k <= 0:
            return ()
        return tuple(self.tokens[self._match : self._match + k])


def draft_length(accept_ewma: float, max_draft: int, available: int, tick: int) -> int:
    """Tokens to verify: scaled by the acceptance EWMA; a low-acceptance session only probes."""
    if accept_ewma < LOW_ACCEPTANCE:
        k = 2 if tick % PROBE_EVERY == 0 else 0
    else:
        k = max(1, round(max_draft * min(accept_ewma * 1.25, 1.0)))
    return min(k, available, max_draft)


class SpeculativeDecode:
    def apply(self, plan: Plan, state: SchedulerState, c: Constraints) -> Plan:
        if c.spec_max_draft <= 0 or plan.empty:
            return plan
        decoders = [i for i in plan.items if i.phase is Phase.DECODE]
        if not decoders or len(decoders) > c.spec_max_streams:
            return plan
        views = views_by_seq(state)
        room = c.n_batch - plan.n_tokens
        items = []
        for item in plan.items:
            view = views[item.seq_id]
            if item.phase is Phase.DECODE and item.n_tokens == 1 and view.draft and room > 0:
                k = min(
                    draft_length(
                        view.spec_accept_ewma, c.spec_max_draft, len(view.draft), state.stats.tick
                    ),
                    room,
                )
                if k > 0:
                    item = replace(item, n_tokens=1 + k)
                    room -= k
            items.append(item)
        return replace(plan, items=tuple(items))
