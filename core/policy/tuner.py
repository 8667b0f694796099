"""Sweet-spot tuner: hill-climb S (background decoders served per tick) and k (ticks a served
background decoder keeps its turn) to maximise tokens/s, with hysteresis.

Owned by the QoS lanes' state (core/policy/lanes.py), fed one observation per tick by their
``observe`` step; the lanes plan with the current (S, k) from the snapshot. It moves only in
windows where the knobs mattered (background decoders were parked), keeps a move that raised
throughput by more than ``eps`` and undoes one that lowered it by more than ``eps`` (then
tries the other direction); within ``eps`` it holds. MoE models (experts activated per
token) get a lower S ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Knob:
    name: str
    value: int
    low: int
    high: int
    step: int = 1  # +1 or -1: the direction being tried


class SweetSpotTuner:
    def __init__(
        self, s_max: int, moe: bool = False, window: int = 24, eps: float = 0.03, rest: int = 4
    ) -> None:
        s_high = max(1, min(s_max, 2 if moe else s_max))
        self.knobs = [Knob("S", s_high, 1, s_high, -1), Knob("k", 1, 1, 4, +1)]
        self.window, self.eps, self.rest = window, eps, rest
        self._resting = 0  # windows to wait before the next exploratory move
        self._turn = 0  # which knob moves next
        self._tokens = 0
        self._ms = 0.0
        self._ticks = 0
        self._last_rate: float | None = None
        self._last_move: tuple[Knob, int] | None = None  # knob, value before the move

    @property
    def s(self) -> int:
        return self.knobs[0].value

    @property
    def k(self) -> int:
        return self.knobs[1].value

    def observe(self, tokens: int, ms: float, contended: bool) -> None:
        if not contended:
            return
        self._tokens += tokens
        self._ms += ms
        self._ticks += 1
        if self._ticks < self.window:
            return
        rate = self._tokens / max(self._ms, 1e-6)
        self._tokens, self._ms, self._ticks = 0, 0.0, 0
        self._step(rate)

    def _settle(self) -> None:
        """Stop exploring for a while and let the other knob move next."""
        self._last_move = None
        self._resting = self.rest
        self._turn = (self._turn + 1) % len(self.knobs)

    def _step(self, rate: float) -> None:
        last = self._last_rate
        if last is not None and self._last_move is not None:
            knob, before = self._last_move
            if rate < last * (1 - self.eps):  # worse: undo, and try the other way next time
                knob.value = before
                knob.step = -knob.step
                self._settle()
                return  # _last_rate stays the restored setting's
            if rate <= last * (1 + self.eps):  # no clear gain: keep it and rest (hysteresis)
                self._last_rate = rate
                self._settle()
                return
        self._last_rate = rate
        if self._resting > 0:
            self._resting -= 1
            return
        knob = self.knobs[self._turn]
        target = min(max(knob.value + knob.step, knob.low), knob.high)
        if target == knob.value:  # at a bound: turn around for next time
            knob.step = -knob.step
            self._last_move = None
            self._turn = (self._turn + 1) % len(self.knobs)
            return
        self._last_move = (knob, knob.value)
        knob.value = target
