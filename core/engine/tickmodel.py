"""The online fit of the tick-time model (core/policy/cost.py's ``TickCost``): owned by the
engine, refitted after every tick over a window of recent ticks, so the model follows the
machine as its speed drifts.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from uma_serve.core.policy.cost import TickCost, TickShape


class OnlineTickModel:
    """Least squares over the most recent ticks, refitted every few ticks.

    Two windows of ``window`` ticks each, one of ticks with prefill and one without, so a long
    stretch of decode-only ticks does not forget what prompt tokens cost (and vice versa). The
    normal equations are kept as running sums: every ``REFIT_EVERY`` ticks the rows that entered
    the windows since are added to them and those pushed out subtracted, and a 5x5 system is
    solved; in between a tick costs a residual check and two appends. (Rebuilding them from the
    windows' 512 rows took 0.3-1 ms of Python: one interactive gap in 16 stretched on a GPU.)
    Coefficients are kept non-negative (an active set: a negative one is dropped and the rest
    refitted); a small ridge settles directions the ticks do not tell apart (with one decoder
    always, the tick goes to the intercept). A tick far off the model, by much more than is
    typical for its kind (a preempted tick, a page-fault storm), is left out, unless such ticks
    keep coming (the machine changed). The first ``warmup`` ticks of a context are not learned
    from (graph capture, first touch of the weights); until ``min_samples`` more are seen the
    prior stands: the constraints' ``tick_prior`` (CPU-sized, or cost.py's GPU_PRIOR on a GPU).
    """

    def __init__(
        self,
        prior: TickCost | None = None,
        window: int = 256,
        min_samples: int = 8,
        warmup: int = 4,
    ) -> None:
        self.min_samples = min_samples
        self.warmup = warmup
        self._rows: dict[bool, deque[tuple[tuple[float, ...], float]]] = {
            False: deque(maxlen=window),
            True: deque(maxlen=window),
        }
        self._typical = {False: 0.0, True: 0.0}  # smoothed |residual| per kind
        self._rejected = {False: 0, True: 0}  # outliers in a row per kind
        self.samples = 0
        self._cost = prior or TickCost()
        self._xtx = np.zeros((N_FEATURES, N_FEATURES))  # Σ x xᵀ over both windows' rows
        self._xty = np.zeros(N_FEATURES)  # Σ x·ms
        self._moves: list[tuple[tuple[float, ...], float, float]] = []  # not yet in the sums

    @property
    def cost(self) -> TickCost:
        return self._cost

    def update(self, shape: TickShape, ms: float) -> None:
        self.samples += 1
        if self.samples <= self.warmup:  # a new context's first ticks build graphs, load code
            return
        kind = shape.prefill > 0
        rows = self._rows[kind]
        known = len(rows) >= self.min_samples  # a kind seen too rarely is news, not noise
        residual = abs(ms - self._cost.predict(shape))
        if known and residual > 4.0 * self._typical[kind] + 0.5 * ms:
            self._rejected[kind] += 1
            if self._rejected[kind] < OUTLIERS_IN_A_ROW:
                return
        self._rejected[kind] = 0
        self._typical[kind] += 0.05 * (residual - self._typical[kind])
        if len(rows) == rows.maxlen:  # the oldest row leaves the window
            self._moves.append((*rows[0], -1.0))
        row = (shape.features(), ms)
        rows.append(row)
        self._moves.append((*row, 1.0))
        n_rows = len(self._rows[False]) + len(self._rows[True])
        due = self.samples % REFIT_EVERY == 0 or n_rows < 4 * REFIT_EVERY  # often while young
        if self.samples >= self.warmup + self.min_samples and due:
            self._settle_moves()
            a, b, c, d, e = (float(v) for v in _nonneg_ridge(self._xtx, self._xty))
            self._cost = TickCost(a, b, c, d, e, self.samples)

    def _settle_moves(self) -> None:
        """Fold the rows that entered or left the windows since the last refit into the sums."""
        if not self._moves:
            return
        rows = np.array([(*f, ms, sign) for f, ms, sign in self._moves])
        x, y, sign = rows[:, :N_FEATURES], rows[:, N_FEATURES], rows[:, N_FEATURES + 1]
        self._xtx += (x * sign[:, None]).T @ x
        self._xty += x.T @ (sign * y)
        self._moves.clear()


REFIT_EVERY = 16  # ticks between refits (a 5x5 solve, ~20-100 us; a GPU tick 1.4 ms)
N_FEATURES = 5
OUTLIERS_IN_A_ROW = 3  # this many far-off ticks of a kind in a row: the machine changed

# the ridge on each coefficient: the per-decoder cost b and the step e are held back, so a
# tick the data cannot split goes to the intercept (always one decoder) or to the per-token
# cost (prompts all of one size), and a step is only seen where prompt sizes vary
RIDGE = np.array([1e-3, 1.0, 1e-3, 1e-3, 1.0])
RIDGE_DIAG = np.diag(RIDGE)


def _nonneg_ridge(xtx: np.ndarray, xty: np.ndarray) -> np.ndarray:
    """min |x·θ - y|² + Σ RIDGE·θ², θ >= 0, from the normal equations, dropping negative
    coefficients one at a time."""
    theta = np.linalg.solve(xtx + RIDGE_DIAG, xty)
    if (theta >= 0).all():  # the usual case: one solve
        return theta
    active = list(range(len(xty)))
    theta = np.zeros(len(xty))
    while active:
        sub = xtx[np.ix_(active, active)] + np.diag(RIDGE[active])
        sol = np.linalg.solve(sub, xty[active])
        if (sol >= 0).all():
            theta[active] = sol
            break
        del active[int(np.argmin(sol))]
    return theta
