import random

from uma_serve.core.engine.tickmodel import OnlineTickModel
from uma_serve.core.policy.cost import TickCost, TickShape


def test_fits_a_linear_machine_from_mixed_ticks() -> None:
    truth = TickCost(12.0, 3.5, 2.8, 0.1)
    model = OnlineTickModel()
    rng = random.Random(0)
    for _ in range(400):
        shape = TickShape(rng.randint(0, 8), rng.choice([0, 0, 1, 16, 64, 256]), rng.uniform(0, 40))
        model.update(shape, truth.predict(shape) * rng.uniform(0.97, 1.03))
    for shape in (TickShape(1, 0, 1.0), TickShape(4, 128, 20.0), TickShape(2, 8, 5.0)):
        assert abs(model.cost.predict(shape) - truth.predict(shape)) / truth.predict(shape) < 0.08


def test_follows_a_machine_that_slows_down() -> None:
    model = OnlineTickModel()
    fast, slow = TickCost(10, 3, 2, 0), TickCost(15, 4.5, 3, 0)
    rng = random.Random(1)
    shapes = [TickShape(rng.randint(1, 4), rng.choice([0, 32]), 0) for _ in range(1200)]
    for s in shapes[:600]:
        model.update(s, fast.predict(s))
    for s in shapes[600:]:
        model.update(s, slow.predict(s))
    probe = TickShape(2, 32, 0)
    assert abs(model.cost.predict(probe) - slow.predict(probe)) < 2.0


def test_prefill_that_fits() -> None:
    cost = TickCost(10, 4, 2, 0)
    assert cost.prefill_that_fits(1, 0, 30) == 8  # 14 ms decode + 8 x 2 ms
    assert cost.prefill_that_fits(5, 0, 20) == 0  # decode alone is over


def test_step_is_paid_once_per_tick_with_prefill() -> None:
    gpu = TickCost(a=1.2, b=0.02, c=0.025, d=0.0, e=2.7)
    assert gpu.predict(TickShape(1, 0, 0)) == 1.22
    assert abs(gpu.predict(TickShape(1, 1, 0)) - 3.945) < 1e-9
    assert abs(gpu.predict(TickShape(1, 256, 0)) - (1.22 + 2.7 + 6.4)) < 1e-9
    assert gpu.prefill_that_fits(1, 0, 2.0) == 0  # the step alone is over the budget
    assert gpu.prefill_that_fits(1, 0, 4.42) == 20
    assert gpu.stepped(16) and not TickCost(10, 4, 2, 0, e=0.5).stepped(16)


def test_learns_the_step_of_a_gpu_like_machine() -> None:
    truth = TickCost(a=1.2, b=0.02, c=0.025, d=0.01, e=2.7)
    model = OnlineTickModel(prior=TickCost(a=1.0, b=0.1, c=0.1, d=0.0))
    rng = random.Random(2)
    for _ in range(600):
        shape = TickShape(
            rng.randint(1, 16), rng.choice([0, 0, 0, 1, 8, 64, 512]), rng.uniform(0, 30)
        )
        model.update(shape, truth.predict(shape) * rng.uniform(0.97, 1.03))
    assert abs(model.cost.e - 2.7) < 0.4
    assert model.cost.stepped(16)


def test_a_preempted_tick_does_not_move_the_fit() -> None:
    truth = TickCost(12.0, 3.5, 2.8, 0.0)
    model = OnlineTickModel()
    rng = random.Random(3)
    for i in range(200):
        shape = TickShape(rng.randint(1, 4), rng.choice([0, 0, 8, 64]), 0.0)
        model.update(shape, 900.0 if i == 150 else truth.predict(shape))
    probe = TickShape(2, 8, 0.0)
    assert abs(model.cost.predict(probe) - truth.predict(probe)) < 0.5


def test_a_long_decode_only_stretch_keeps_what_prefill_costs() -> None:
    truth = TickCost(1.2, 0.02, 0.025, 0.0, e=2.7)
    model = OnlineTickModel(window=64)
    for n in (16, 64, 256, 512) * 8:
        model.update(TickShape(1, n, 0.0), truth.predict(TickShape(1, n, 0.0)))
    for _ in range(1000):
        model.update(TickShape(1, 0, 0.0), truth.predict(TickShape(1, 0, 0.0)))
    probe = TickShape(1, 256, 0.0)
    assert abs(model.cost.predict(probe) - truth.predict(probe)) < 0.2


def test_running_normal_equations_match_the_windows() -> None:
    """The sums kept per tick (rows entering and leaving the windows) equal the normal
    equations rebuilt from the rows the windows hold."""
    import numpy as np

    m = OnlineTickModel(window=32)
    rng = np.random.default_rng(7)
    for i in range(500):
        prefill = int(rng.integers(1, 512)) if i % 3 == 0 else 0
        shape = TickShape(int(rng.integers(1, 5)), prefill, float(rng.uniform(0.5, 9.0)))
        m.update(shape, 1.4 + 0.02 * prefill + rng.normal(0.0, 0.05))
    m._settle_moves()
    rows = [*m._rows[False], *m._rows[True]]
    assert len(rows) == 64
    x = np.array([f for f, _ in rows])
    y = np.array([ms for _, ms in rows])
    assert np.allclose(m._xtx, x.T @ x) and np.allclose(m._xty, x.T @ y)
