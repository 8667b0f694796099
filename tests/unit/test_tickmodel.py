import random

from uma_serve.core.policy.tickmodel import OnlineTickModel, TickCost, TickShape


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
