"""What the engine needs of a runtime: the ``RuntimeApi`` protocol.

``Runtime`` (runtime.py, llama.cpp) implements it; so does the unit tests' fake runtime, which
decodes instantly without a model. The engine, its scheduler and executor, the prefix cache
and the sampler are typed against this protocol, not against llama.cpp.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from uma_serve.core import protocol as proto
from uma_serve.core.runtime.params import RuntimeParams, Span


class Constraint(Protocol):
    """What a grammar (core/runtime/grammar.py) does for the sampling chain."""

    def allows(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray: ...
    def allows_one(self, token: int) -> bool: ...
    def allowed(
        self, row: np.ndarray, p: proto.Sampling, ids: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...
    def accept(self, token: int) -> None: ...
    def free(self) -> None: ...


@runtime_checkable
class RuntimeApi(Protocol):
    params: RuntimeParams
    n_ctx: int  # KV cells in all
    n_ctx_per_seq: int  # prompt + output a sequence may hold

    # ---- decode ----
    def decode(self, spans: list[Span]) -> tuple[int, list[int]]:
        """One llama_decode over the spans: its rc and each span's logits row (-1: none)."""
        ...

    def launch(self, spans: list[Span], on_thread: bool = False) -> list[int]:
        """``decode`` started (``on_thread``: on the runtime's launch thread, if it has one):
        each span's logits row."""
        ...

    def synchronize(self) -> int:
        """Wait for the last launch and the device: the launch's rc."""
        ...

    def abort(self) -> None:
        """Stop a running decode (any thread); it returns rc 2."""
        ...

    def clear_abort(self) -> None: ...

    # ---- the rows of the last decode ----
    def logits_row(self, row: int) -> np.ndarray: ...
    def candidates(self, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The device's top-k (ids, logits) of each row (device_top_k > 0)."""
        ...

    def wide_candidates(self, row: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The device top-k (ids, logits) of a row whose chain hands over ``k``."""
        ...

    def set_device_chain(self, seq_id: int, k: int) -> None:
        """A sequence's device chain: a top-k of ``k``; 0: its whole row."""
        ...

    def graph_reuses(self) -> int:
        """Decodes so far that reused the previous decode's graph (llama.cpp's count)."""
        ...

    def grammar(self, text: str) -> Constraint:
        """A request's GBNF grammar over this model's vocabulary."""
        ...

    # ---- tokens ----
    def piece(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...

    # ---- KV memory ----
    def seq_clear(self, seq_id: int) -> None: ...
    def seq_trim(self, seq_id: int, from_pos: int) -> None: ...
    def seq_copy(self, src: int, dst: int, n: int) -> None: ...
    def seq_save(self, path: str, seq_id: int, tokens: list[int]) -> bool: ...
    def seq_load(self, path: str, seq_id: int, capacity: int) -> list[int] | None: ...
    def seq_state(self, seq_id: int) -> bytes: ...
    def seq_restore(self, seq_id: int, data: bytes) -> bool: ...
    def clear_all(self) -> None: ...
