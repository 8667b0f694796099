from uma_serve.core.policy.tuner import SweetSpotTuner


def run(tuner: SweetSpotTuner, rate_of, ticks: int) -> list[int]:
    seen = []
    for _ in range(ticks):
        tokens = tuner.s + 1
        tuner.observe(tokens, tokens / rate_of(tuner.s, tuner.k), contended=True)
        seen.append(tuner.s)
    return seen


def test_climbs_to_the_best_s_and_mostly_stays() -> None:
    best = 3
    tuner = SweetSpotTuner(s_max=8, window=4)
    seen = run(tuner, lambda s, k: 1.0 - 0.1 * abs(s - best), 2000)
    late = seen[1000:]
    assert late.count(best) / len(late) > 0.7
    assert set(late) <= {best - 1, best, best + 1}


def test_moe_lowers_the_ceiling() -> None:
    tuner = SweetSpotTuner(s_max=8, moe=True)
    assert tuner.s == 2 and tuner.knobs[0].high == 2


def test_ignores_uncontended_ticks() -> None:
    tuner = SweetSpotTuner(s_max=4, window=2)
    for _ in range(100):
        tuner.observe(1, 10.0, contended=False)
    assert (tuner.s, tuner.k) == (4, 1)
