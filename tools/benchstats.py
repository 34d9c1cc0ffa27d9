"""Repeats for the benchmarks: each figure is the median of at least five runs, printed with its spread.

    >>> spread([3.0, 1.0, 2.0, 5.0, 4.0], ".1f")
    '3.0 [1.0-5.0]'

``median [min-max]`` over the repeats: on a machine shared with other work the spread is the honest error bar.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

REPEATS = 5


def repeat(measure: Callable[[], float], repeats: int = REPEATS) -> list[float]:
    """`measure()` run `repeats` times (at least 5): its values in order."""
    if repeats < 5:
        raise ValueError(f"at least 5 repeats, not {repeats}")
    return [measure() for _ in range(repeats)]


def spread(values: Sequence[float], fmt: str = ",.0f") -> str:
    """``median [min-max]`` of `values`, each formatted with `fmt`."""
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
