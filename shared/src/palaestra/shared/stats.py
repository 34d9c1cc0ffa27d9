"""Confidence intervals shared by the evaluations of every package (the one home of generic statistics).

- `wilson_interval(k, n)`: the Wilson score interval of a binomial rate (good
  at rates near 0 or 1 and small n, where the normal interval fails);
- `bootstrap_mean_interval(values)`: a percentile bootstrap interval of a mean
  (for returns and scores that are not rates), seeded so reports repeat.

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
