"""The requests waiting for a sequence and the free sequence ids.

Interactive requests are admitted first (FIFO among them); background ones only while more
than ``reserved`` sequence ids are free, so an interactive arrival always finds one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from uma_serve.core.sequence import Sequence


class AdmissionQueue:
    def __init__(self, seq_ids: Iterable[int], reserved: int) -> None:
        self.waiting: deque[Sequence] = deque()
        self.free_ids = list(seq_ids)
        self.reserved = reserved  # sequence ids only interactive requests may take

    def __len__(self) -> int:
        return len(self.waiting)

    def _next(self) -> Sequence | None:
        if not self.free_ids:
            return None
        first_bg = None
        for seq in self.waiting:
            if seq.request.qos == "interactive":
                return seq
            first_bg = first_bg or seq
        return first_bg if len(self.free_ids) > self.reserved else None

    def admittable(self) -> bool:
        """A waiting request could take a free sequence now."""
        return self._next() is not None

    def admit(self) -> Sequence | None:
        """The next request to run, with its sequence id taken (None: nothing can run now)."""
        seq = self._next()
        if seq is not None:
            self.waiting.remove(seq)
            seq.seq_id = self.free_ids.pop()
        return seq

    def release(self, seq_id: int) -> None:
        self.free_ids.append(seq_id)

    def remove(self, match: Callable[[Sequence], bool]) -> list[Sequence]:
        """Take the waiting requests that ``match`` out of the queue."""
        gone = [s for s in self.waiting if match(s)]
        for seq in gone:
            self.waiting.remove(seq)
        return gone

    def has_interactive(self) -> bool:
        return any(s.request.qos == "interactive" for s in self.waiting)
