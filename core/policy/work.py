"""Which work is protected: the scheduler classifies work, not only requests.

- Every stream's decode tokens are protected (what a reader sees between two tokens), unless
  the request is labeled ``background`` (a batch job's stream).
- A prompt is protected only while it is short: a *chat turn*, whose uncached part fits the
  interactive allowance below, is prefilled TTFT-first. A longer prompt (a pasted document,
  an agent's fresh transcript) is bulk work, chunked into the capacity the protected work
  leaves; once its prompt is done, its own stream is protected like any other.

The allowance is what the tick-time model says one prefill tick can carry within
``--slo-ttft-ms`` (a prompt that cannot meet the TTFT target in one tick gains nothing from
going first), and at most one batch (``--n-batch``): a prompt that needs more than one tick is
bulk on any machine. Labels still exist and mean more: ``background`` makes all of a request's
work bulk, including its decode tokens.
"""

from __future__ import annotations

from uma_serve.core.policy.cost import TickCost
from uma_serve.core.policy.plan import Constraints

INTERACTIVE = "interactive"
BACKGROUND = "background"


def prompt_allowance(cost: TickCost, c: Constraints) -> int:
    """Uncached prompt tokens a request may have and still be prefilled TTFT-first."""
    budget = c.slo_ttft_ms or c.bg_tick_ms
    return max(min(cost.prefill_that_fits(0, 0.0, budget), c.n_batch), c.min_prefill_tokens)


def prompt_class(label: str, uncached: int, allowance: int) -> str:
    """The class of a request's prompt work: a chat turn's is interactive, the rest bulk."""
    return INTERACTIVE if label != BACKGROUND and uncached <= allowance else BACKGROUND
