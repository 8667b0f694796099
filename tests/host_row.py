"""A whole logits row through the engine's sampler (core/sampling.py's host path), for tests
that hold a row of their own."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from uma_serve.core.protocol import Sampling
from uma_serve.core.sampling import Row, Sampler, SamplerState


def only(**named: object) -> Sampling:
    """Sampling parameters with only the named truncations: top-k, top-p and min-p are off
    unless named (the wire's defaults, llama.cpp server's, turn all three on)."""
    return Sampling(**{"top_k": 0, "top_p": 1.0, "min_p": 0.0, **named})  # type: ignore[arg-type]


class _OneRow:
    """What the sampler reads of a runtime without a device top-k: the row itself."""

    params = SimpleNamespace(device_top_k=0)

    def __init__(self, row: np.ndarray) -> None:
        self.row = row

    def logits_row(self, row: int) -> np.ndarray:
        return self.row


def host_token(state: SamplerState, row: np.ndarray) -> int:
    """The token the sampler draws from ``row`` (biased and penalised in place, as the engine's
    rows are); the state accepts it."""
    [(token, _)] = Sampler(_OneRow(row)).sample([Row(state, 0)])  # type: ignore[arg-type]
    return token
