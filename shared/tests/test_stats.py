"""The shared Wilson interval against published values."""

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
