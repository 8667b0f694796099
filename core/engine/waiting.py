"""The requests waiting for a sequence and the free sequence ids.

Chat turns (interactive requests with a short prompt, policy/work.py) are admitted first (FIFO
among them); the rest, labeled background or with a long prompt, only while more than
``reserved`` sequence ids are free, so a chat turn always finds one. A request
may be held back while a running sequence computes a prefix it shares (the prefix cache then
copies that KV instead of computing it again).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from uma_serve.core.engine.sequence import Sequence

Hold = Callable[[Sequence], bool]
Suits = Callable[[Sequence], Callable[[int], bool] | None]  # which free ids suit a request


class WaitingQueue:
    def __init__(self, seq_ids: Iterable[int], reserved: int) -> None:
        self.waiting: deque[Sequence] = deque()
        self.free_ids = list(seq_ids)
        # sequence ids only chat turns may take; never all of them (one sequence: none)
        self.reserved = min(reserved, max(len(self.free_ids) - 1, 0))

    def __len__(self) -> int:
        return len(self.waiting)

    def _next(self, hold: Hold | None) -> Sequence | None:
        if not self.free_ids:
            return None
        first_bg = None
        for seq in self.waiting:
            if hold is not None and hold(seq):
                continue
            if seq.interactive:
                return seq
            first_bg = first_bg or seq
        return first_bg if len(self.free_ids) > self.reserved else None

    def admittable(self, hold: Hold | None = None) -> bool:
        """A waiting request could take a free sequence now."""
        return self._next(hold) is not None

    def admit(self, hold: Hold | None = None, suits: Suits | None = None) -> Sequence | None:
        """The next request to run, with its sequence id taken (None: nothing can run now).
        Requests ``hold`` names wait (a running sequence is computing the prefix they share).
        The id is the last freed one that ``suits`` the request, else the last freed one."""
        seq = self._next(hold)
        if seq is not None:
            self.waiting.remove(seq)
            seq.seq_id = self._take_id(suits(seq) if suits is not None else None)
        return seq

    def _take_id(self, fits: Callable[[int], bool] | None) -> int:
        """The last freed id that ``fits``, else the last freed one."""
        ids = self.free_ids
        for i in range(len(ids) - 1, -1, -1):
            if fits is None or fits(ids[i]):
                return ids.pop(i)
        return ids.pop()

    def release(self, seq_id: int) -> None:
        self.free_ids.append(seq_id)

    def remove(self, match: Callable[[Sequence], bool]) -> list[Sequence]:
        """Take the waiting requests that ``match`` out of the queue."""
        gone = [s for s in self.waiting if match(s)]
        for seq in gone:
            self.waiting.remove(seq)
        return gone

    def has_interactive(self) -> bool:
        return any(s.interactive for s in self.waiting)
