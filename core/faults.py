"""Fault injection for the reliability tests (docs/RELIABILITY.md); off unless set.

A hard llama_decode failure or a model without a chat template cannot be produced on demand
with the embedded model, so two environment variables stand in for them, read once at start:

- ``UMA_FAULT_DECODE_FAIL=TEXT``: a tick that carries a request whose prompt contains TEXT
  reports llama_decode's failure (rc -1), as a real hard failure would (E_RUNTIME_001).
- ``UMA_FAULT_NO_CHAT_TEMPLATE=1``: the model is served as if it had no chat template
  (``messages`` get E_MODEL_001).

The decode failure is a wrapper around the runtime (``FailingDecode``), installed by the
daemon: the engine runs unchanged on it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from uma_serve.core.runtime.api import RuntimeApi
from uma_serve.core.runtime.params import Span

DECODE_FAIL_RC = -1  # what llama_decode returns for an invalid batch


@dataclass(frozen=True)
class Faults:
    decode_fail: str | None = None
    no_chat_template: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Faults:
        return cls(
            decode_fail=env.get("UMA_FAULT_DECODE_FAIL") or None,
            no_chat_template=env.get("UMA_FAULT_NO_CHAT_TEMPLATE", "") not in ("", "0"),
        )

    @property
    def any(self) -> bool:
        return self.decode_fail is not None or self.no_chat_template

    def wrap(self, runtime: RuntimeApi) -> RuntimeApi:
        """The runtime the engine runs on: ``runtime`` itself unless a decode fault is set."""
        if self.decode_fail is None:
            return runtime
        return FailingDecode(runtime, self.decode_fail)  # type: ignore[return-value]


class FailingDecode:
    """A RuntimeApi whose llama_decode fails (rc -1, nothing decoded) whenever the batch
    touches a sequence whose KV would hold ``marker``'s text. It mirrors each sequence's
    tokens by position through decode, trim, copy and clear, as the KV cache holds them;
    everything else is the wrapped runtime's."""

    def __init__(self, runtime: RuntimeApi, marker: str) -> None:
        self._runtime = runtime
        self._marker = marker.encode()
        self._held: dict[int, list[int]] = {}  # seq_id -> its tokens, by position
        self._rc = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    def decode(self, spans: list[Span]) -> tuple[int, list[int]]:
        for s in spans:
            held = self._held.setdefault(s.seq_id, [])
            del held[s.pos :]
            held.extend(s.tokens)
        if any(self._marker in self._text(s.seq_id) for s in spans):
            return DECODE_FAIL_RC, [-1] * len(spans)
        return self._runtime.decode(spans)

    def launch(self, spans: list[Span], on_thread: bool = False) -> list[int]:
        """Decodes here, not on a launch thread (the faults need no overlap)."""
        self._rc, rows = self.decode(spans)
        return rows

    def synchronize(self) -> int:
        self._runtime.synchronize()
        return self._rc

    def _text(self, seq_id: int) -> bytes:
        return b"".join(self._runtime.piece(t) for t in self._held.get(seq_id, ()))

    def seq_trim(self, seq_id: int, from_pos: int) -> None:
        del self._held.get(seq_id, [])[from_pos:]
        self._runtime.seq_trim(seq_id, from_pos)

    def seq_copy(self, src: int, dst: int, n: int) -> None:
        self._held[dst] = self._held.get(src, [])[:n]
        self._runtime.seq_copy(src, dst, n)

    def seq_clear(self, seq_id: int) -> None:
        self._held.pop(seq_id, None)
        self._runtime.seq_clear(seq_id)

    def clear_all(self) -> None:
        self._held.clear()
        self._runtime.clear_all()
