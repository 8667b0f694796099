"""A sequence's KV cells in llama.cpp's unified cache: clear, trim, share (tag), save and
restore; each mirrored on the sequence's shadow id where the runtime keeps shadows (the
sliding-window layers' cells a prefix reuse needs: core/runtime/runtime.py).

Each of llama.cpp's operations on a sequence's cells is a pass over every cell of the context,
in each of its caches (a Gemma 3 context keeps two): 138 us for a clear at 32k cells on the
2-core CPU, the engine thread's time whatever the id holds.
So a clear skips the passes over an id known to hold nothing: one cleared since it was last
written (``_clean``), a shadow never tagged since its last clear (``_shadowed`` 0); and a copy
of fewer positions than the shadow's lag leaves the shadow untagged. A short request then costs
three passes of eight (its reply's copy into the cache, its id's clear and, later, the entry's):
259-278 us against 667-711 us at 32k cells on the 2-core CPU.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import llama_cpp as ll

from uma_serve.core.runtime.params import RuntimeParams

P = ParamSpec("P")
R = TypeVar("R")
K = TypeVar("K", bound="KvMemory")


def landed(method: Callable[Concatenate[K, P], R]) -> Callable[Concatenate[K, P], R]:
    """A call on the context: it first waits for a decode on the launch thread to return
    (llama.cpp's context is not thread-safe; the order of calls is kept)."""

    @functools.wraps(method)
    def call(self: K, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._pending is not None:
            self._landed()
        return method(self, *args, **kwargs)

    return call


class KvMemory:
    """Part of Runtime: the KV memory operations over its context."""

    ctx: Any
    memory: Any
    params: RuntimeParams
    _n_ids: int
    _shadowed: list[int]
    _shadow_lag: int  # untagged positions a sequence may have (runtime.py)
    _clean: set[int]  # ids that hold no cell: cleared, and not written since
    _pending: Any  # a decode on the launch thread, not yet returned (runtime.py)

    def _landed(self) -> int: ...

    @landed
    def seq_clear(self, seq_id: int) -> None:
        if seq_id not in self._clean:
            ll.llama_memory_seq_rm(self.memory, seq_id, -1, -1)
        if self.params.shadow and self._shadowed[seq_id] > 0:
            ll.llama_memory_seq_rm(self.memory, seq_id + self._n_ids, -1, -1)
            self._shadowed[seq_id] = 0
        self._clean.add(seq_id)

    @landed
    def seq_trim(self, seq_id: int, from_pos: int) -> None:
        ll.llama_memory_seq_rm(self.memory, seq_id, from_pos, -1)
        if self.params.shadow:
            ll.llama_memory_seq_rm(self.memory, seq_id + self._n_ids, from_pos, -1)
            self._shadowed[seq_id] = min(self._shadowed[seq_id], from_pos)

    @landed
    def seq_copy(self, src: int, dst: int, n: int) -> None:
        """Positions [0, n) of ``src`` also become ``dst``'s. In a unified KV cache this tags
        the same cells with one more sequence id: no copy, no compute."""
        self._clean.discard(dst)
        ll.llama_memory_seq_cp(self.memory, src, dst, 0, n)
        # fewer untagged positions than the lag is any sequence's state between two tags:
        # a stored short reply's shadow then costs no pass, nor does its eviction's clear
        if self.params.shadow and n >= self._shadow_lag:
            ll.llama_memory_seq_cp(self.memory, src, dst + self._n_ids, 0, n)
            self._shadowed[dst] = max(self._shadowed[dst], n)

    @landed
    def seq_save(self, path: str, seq_id: int, tokens: list[int]) -> bool:
        """Write one sequence's KV (and its token list) to ``path``."""
        arr = (ll.llama_token * len(tokens))(*tokens)
        n = ll.llama_state_seq_save_file(self.ctx, path.encode(), seq_id, arr, len(tokens))
        return n > 0

    @landed
    def seq_load(self, path: str, seq_id: int, capacity: int) -> list[int] | None:
        """Read a sequence saved by seq_save into ``seq_id``; its tokens, or None."""
        arr = (ll.llama_token * capacity)()
        count = ctypes.c_size_t(0)
        self._clean.discard(seq_id)
        n = ll.llama_state_seq_load_file(
            self.ctx, path.encode(), seq_id, arr, capacity, ctypes.byref(count)
        )
        if n == 0:
            return None
        tokens = list(arr[: count.value])
        if self.params.shadow:
            ll.llama_memory_seq_cp(self.memory, seq_id, seq_id + self._n_ids, 0, len(tokens))
            self._shadowed[seq_id] = len(tokens)
        return tokens

    @landed
    def seq_state(self, seq_id: int) -> bytes:
        """One sequence's KV cells (positions and K/V of every layer) as bytes."""
        size = ll.llama_state_seq_get_size(self.ctx, seq_id)
        buf = bytearray(size)
        n = ll.llama_state_seq_get_data(
            self.ctx, (ctypes.c_uint8 * size).from_buffer(buf), size, seq_id
        )
        return bytes(memoryview(buf)[:n])

    @landed
    def seq_restore(self, seq_id: int, data: bytes) -> bool:
        """Put bytes from seq_state back as ``seq_id``'s cells: one contiguous run of cells
        from the first free one that fits, in position order."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        self._clean.discard(seq_id)
        if ll.llama_state_seq_set_data(self.ctx, buf, len(data), seq_id) == 0:
            return False
        if self.params.shadow:
            n = self.seq_pos_max(seq_id) + 1
            ll.llama_memory_seq_cp(self.memory, seq_id, seq_id + self._n_ids, 0, n)
            self._shadowed[seq_id] = n
        return True

    @landed
    def clear_all(self) -> None:
        """Free every cell of every sequence (metadata only: the next writes overwrite)."""
        ll.llama_memory_clear(self.memory, False)
        self._shadowed = [0] * self._n_ids
        self._clean = set(range(self._n_ids))

    @landed
    def seq_pos_max(self, seq_id: int) -> int:
        return ll.llama_memory_seq_pos_max(self.memory, seq_id)

    @landed
    def seq_pos_min(self, seq_id: int) -> int:
        return ll.llama_memory_seq_pos_min(self.memory, seq_id)
