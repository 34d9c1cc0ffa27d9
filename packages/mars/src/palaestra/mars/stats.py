"""Rates and means with confidence intervals for evaluation results.

- `wilson_interval(k, n)`: the Wilson score interval of a binomial rate
  (`palaestra.shared.stats`, re-exported here).
- `bootstrap_mean_interval(values)`: a percentile bootstrap interval of a mean.
- `summarize(results, seat)`: win / draw / loss / format-loss rates and the
  mean return of one seat over `EpisodeResult`s, each with its interval.

>>> lo, hi = wilson_interval(5, 10)
>>> round(lo, 3), round(hi, 3)
(0.237, 0.763)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from palaestra.shared.stats import Z95, wilson_interval

__all__ = ["Z95", "bootstrap_mean_interval", "summarize", "wilson_interval"]


def bootstrap_mean_interval(
    values: Sequence[float], resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


def summarize(results: Sequence[Any], seat: int) -> dict[str, float]:
    """Rates (with 95% intervals) and mean return for `seat` over episode results."""
    n = len(results)
    wins = sum(1 for r in results if r.winner == seat)
    draws = sum(1 for r in results if r.winner == -1)
    losses = sum(1 for r in results if r.winner is not None and r.winner not in (seat, -1))
    format_losses = sum(1 for r in results if r.format_loser == seat)
    returns = [r.returns[seat] if r.returns else 0.0 for r in results]
    out: dict[str, float] = {"episodes": float(n)}
    counts = {"win_rate": wins, "draw_rate": draws, "loss_rate": losses, "format_loss_rate": format_losses}
    for name, k in counts.items():
        lo, hi = wilson_interval(k, n)
        out.update({name: k / n if n else 0.0, f"{name}_lo": lo, f"{name}_hi": hi})
    lo, hi = bootstrap_mean_interval(returns)
    out.update({"mean_return": sum(returns) / n if n else 0.0, "mean_return_lo": lo, "mean_return_hi": hi})
    return out
