"""The shared Wilson interval against published values."""

import pytest

from palaestra.shared.stats import wilson_interval


def test_wilson_interval_matches_textbook_values():
    # 95% Wilson score intervals (Newcombe 1998): 5/10 -> (0.2366, 0.7634), 0/10 -> (0, 0.2775)
    assert [round(x, 4) for x in wilson_interval(5, 10)] == [0.2366, 0.7634]
    assert [round(x, 4) for x in wilson_interval(0, 10)] == [0.0, 0.2775]
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_bootstrap_mean_interval_agrees_with_the_normal_interval_on_a_large_sample():
    import math
    import random

    from palaestra.shared.stats import bootstrap_mean_interval

    rng = random.Random(1)
    values = [rng.gauss(3.0, 2.0) for _ in range(400)]
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = 1.959964 * sd / math.sqrt(len(values))  # the normal-theory 95% interval: the bootstrap approximates it
    lo, hi = bootstrap_mean_interval(values, resamples=2000)
    assert abs(lo - (mean - half)) < 0.04 and abs(hi - (mean + half)) < 0.04
    assert bootstrap_mean_interval([]) == (0.0, 0.0)
    assert bootstrap_mean_interval([2.5, 2.5, 2.5]) == (2.5, 2.5)
    assert bootstrap_mean_interval(values, seed=3) == bootstrap_mean_interval(values, seed=3)  # seeded


def test_t_quantile_against_closed_forms_and_scipy():
    import math

    from scipy import stats

    from palaestra.shared.stats import t_quantile

    for p in (0.6, 0.9, 0.975, 0.995):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)  # Cauchy
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
        for df in (3, 4, 7, 30, 200):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)
    assert t_quantile(0.025, 5) == pytest.approx(-t_quantile(0.975, 5))


def test_t_mean_interval_is_the_textbook_one():
    from palaestra.shared.stats import t_mean_interval

    # mean 11, sd 1, n 3: 11 -/+ 4.302653 / sqrt(3)
    lo, hi = t_mean_interval([10.0, 11.0, 12.0])
    assert (lo, hi) == pytest.approx((11 - 2.484138, 11 + 2.484138), abs=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        t_mean_interval([1.0])
