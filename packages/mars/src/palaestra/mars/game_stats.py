"""Rates and means with confidence intervals for evaluation results (the intervals: `palaestra.shared.stats`).

- `summarize(results, seat)`: win / draw / loss / format-loss / truncated /
  failed rates and the mean return of one seat over `EpisodeResult`s, each with
  its interval (``seat`` a list: each result's own seat, e.g. both seats pooled).
  A truncated or failed game has no winner: it is in no other rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from palaestra.shared.stats import bootstrap_mean_interval, wilson_interval


def summarize(results: Sequence[Any], seat: int | Sequence[int]) -> dict[str, float]:
    """Rates (with 95% intervals) and mean return for `seat` (one seat, or one per result) over episode results."""
    n = len(results)
    seats = [seat] * n if isinstance(seat, int) else list(seat)
    if len(seats) != n:
        raise ValueError(f"{len(seats)} seats for {n} results")
    pairs = list(zip(results, seats))
    wins = sum(1 for r, s in pairs if r.winner == s)
    draws = sum(1 for r, _ in pairs if r.winner == -1)
    losses = sum(1 for r, s in pairs if r.winner is not None and r.winner not in (s, -1))
    format_losses = sum(1 for r, s in pairs if r.format_loser == s)
    truncated = sum(1 for r in results if getattr(r, "truncated", False))
    failed = sum(1 for r in results if getattr(r, "failed", False))
    returns = [r.returns[s] if r.returns else 0.0 for r, s in pairs]
    out: dict[str, float] = {"episodes": float(n)}
    counts = {"win_rate": wins, "draw_rate": draws, "loss_rate": losses, "format_loss_rate": format_losses}
    counts.update(truncated_rate=truncated, failed_rate=failed)
    for name, k in counts.items():
        lo, hi = wilson_interval(k, n)
        out.update({name: k / n if n else 0.0, f"{name}_lo": lo, f"{name}_hi": hi})
    lo, hi = bootstrap_mean_interval(returns)
    out.update({"mean_return": sum(returns) / n if n else 0.0, "mean_return_lo": lo, "mean_return_hi": hi})
    return out
