"""Which work is protected: the scheduler classifies work, not only requests.

- Every stream's decode tokens are protected (what a reader sees between two tokens), unless
  the request is labeled ``background`` (a batch job's stream).
- A prompt is protected only while it is short: a *chat turn*, whose uncached part fits the
  interactive allowance below, is prefilled TTFT-first. A longer prompt (a pasted document,
  an agent's fresh transcript) is bulk work, chunked into the capacity the protected work
  leaves; once its prompt is done, its own stream is protected like any other.

The allowance is what the tick-time model says one prefill tick can carry within
``--slo-ttft-ms``, and at most one batch (``--n-batch``): a prompt that needs more than one
batch is bulk on any machine. It is never below ``CHAT_TOKENS``, a message a person types: on
a 2-core CPU one tick prefills ~130 tokens within 250 ms, and a 150-token question that
starts a conversation under a paste storm waited 5.4 s as bulk work against 0.75 s alone
(bench conversation), while going first costs the documents little. Only the uncached part
counts: a conversation's next turn, whose history is in the prefix cache, is a chat turn.
Labels still exist and mean more: ``background`` makes all of a request's work bulk,
including its decode tokens.
"""

from __future__ import annotations

from uma_serve.core.policy.cost import TickCost
from uma_serve.core.policy.plan import Constraints

INTERACTIVE = "interactive"
BACKGROUND = "background"
CHAT_TOKENS = 256  # a typed message (~190 words) is a chat turn on any machine


def prompt_allowance(cost: TickCost, c: Constraints) -> int:
    """Uncached prompt tokens a request may have and still be prefilled TTFT-first."""
    budget = c.slo_ttft_ms or c.bg_tick_ms
    fits = max(cost.prefill_that_fits(0, 0.0, budget), CHAT_TOKENS, c.min_prefill_tokens)
    return min(fits, c.n_batch)


def prompt_class(label: str, uncached: int, allowance: int) -> str:
    """The class of a request's prompt work: a chat turn's is interactive, the rest bulk."""
    return INTERACTIVE if label != BACKGROUND and uncached <= allowance else BACKGROUND
