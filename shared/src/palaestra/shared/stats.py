"""Confidence intervals shared by the evaluations of every package (the one home of generic statistics).

- `wilson_interval(k, n)`: the Wilson score interval of a binomial rate (good
  at rates near 0 or 1 and small n, where the normal interval fails);
- `bootstrap_mean_interval(values)`: a percentile bootstrap interval of a mean
  (for returns and scores that are not rates), seeded so reports repeat;
- `t_mean_interval(values)`: the Student t interval of a mean from a few
  independent values (a figure across seeds), with `t_quantile` computed from
  the regularized incomplete beta function (no SciPy needed).

>>> lo, hi = wilson_interval(5, 10)
>>> round(lo, 3), round(hi, 3)
(0.237, 0.763)
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of ``successes`` out of ``n``; (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends (no 1e-17 rounding)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def bootstrap_mean_interval(
    values: Sequence[float], resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of `values` (`resamples` resamples, seeded); (0, 0) if empty."""
    if not values:
        return 0.0, 0.0
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


def t_mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """``mean -/+ t_{(1+level)/2, n-1} * sd / sqrt(n)`` (sd with n - 1); needs at least 2 values."""
    n = len(values)
    if n < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {n}")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t with `df` degrees of freedom (bisection on `t_cdf`, to 1e-12)."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t: ``1 - I_x(df/2, 1/2) / 2`` with ``x = df / (df + t^2)``, for t >= 0."""
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Numerical Recipes 6.4)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1 - math.exp(log_front) * _betacf(b, a, 1 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1 + aa * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < eps:
            break
    return h
