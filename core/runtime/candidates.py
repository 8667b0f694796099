"""The device's candidates: each row's top-k (token ids and logits) that a backend sampler kept
inside the decode graph, read from llama.cpp's buffers as Python lists.

Every call here keeps the GIL (gil.py), and the lists are drawn from in plain Python
(core/draw.py's ``draw_lists``): numpy lets the GIL go in its sorts, gathers and reductions
at any size and in elementwise maths over 500 elements, and on a GPU host each release hands
the GIL to a context's launch thread or to the I/O thread waiting for it, while the engine
thread, whose work bounds the ticks, waits to get it back. An H100 host at 64 streams (four
contexts of 16), from the engine's own timings: sampling 16 rows took 615 us of a 1.84 ms
step with the rows read as one numpy gather and drawn with numpy.
"""

from __future__ import annotations

import llama_cpp as ll

from uma_serve.core.runtime.gil import held

# read after the tick's synchronize: they return at once, so they keep the GIL (gil.py)
_count_ith = held(ll.llama_get_sampled_candidates_count_ith)
_candidates_ith = held(ll.llama_get_sampled_candidates_ith)
_logits_ith = held(ll.llama_get_sampled_logits_ith)

Candidates = tuple[list[int], list[float]]  # a row's token ids and their logits, unsorted


def read(ctx: ll.llama_context_p, rows: list[int], k: int) -> list[Candidates]:
    """The top-k of batch ``rows``: for each, its token ids and their logits (unsorted; at most
    ``k``), copied out of llama.cpp's buffers (valid until the next decode)."""
    out: list[Candidates] = []
    for row in rows:
        n = min(_count_ith(ctx, row), k)
        out.append((_candidates_ith(ctx, row)[:n], _logits_ith(ctx, row)[:n]))
    return out
