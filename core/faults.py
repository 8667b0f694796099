"""Fault injection for the reliability tests (docs/RELIABILITY.md); off unless set.

A hard llama_decode failure or a model without a chat template cannot be produced on demand
with the embedded model, so two environment variables stand in for them, read once at start:

- ``UMA_FAULT_DECODE_FAIL=TEXT``: a tick that carries a request whose prompt contains TEXT
  reports llama_decode's failure (rc -1), as a real hard failure would (E_RUNTIME_001).
- ``UMA_FAULT_NO_CHAT_TEMPLATE=1``: the model is served as if it had no chat template
  (``messages`` get E_MODEL_001).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

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
