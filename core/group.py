"""A generate request with ``n`` > 1: n sequences admitted together or not at all.

Sent as n separate requests, two such requests could each be admitted in part up to
``--max-sessions`` and both be refused (every sequence of a request is needed). As one frame
the core checks the room for all n at once; each sequence is then an ordinary request with
its own id and seed, as the gateway numbers the choices.
"""

from __future__ import annotations

import msgspec

from uma_serve.core import protocol as p


def members(req: p.Generate) -> list[p.Generate]:
    """The requests of ``req``: itself when n is 1, else ids ``<id>-<i>``, seeds ``seed + i``."""
    if req.n == 1:
        return [req]
    seed = req.seed
    return [
        msgspec.structs.replace(
            req,
            id=f"{req.id}-{i}",
            n=1,
            seed=None if seed is None else (seed + i) % (1 << 32),
        )
        for i in range(req.n)
    ]
