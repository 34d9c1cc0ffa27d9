"""Reward registry: ``reward(sample, completion, **info) -> float`` (or ``(float, info)``).

Rewards are registered by name (packages register theirs on import; code can
register one at run time, as AED does with LLM-written rewards) and composed
by weights from config::

    rewards: {fc_binary: 1.0, length_penalty: 0.1}

>>> @REWARDS.register("exact")
... def exact(sample, completion, **info):
...     return float(completion.strip() == sample["answer"])
>>> combined = compose({"exact": 2.0})
>>> combined({"answer": "4"}, " 4 ")
(2.0, {'exact': 1.0})
>>> REWARDS.unregister("exact")
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from palaestra.shared.registry import Registry

RewardFn = Callable[..., float | tuple[float, dict]]
REWARDS: Registry[RewardFn] = Registry("reward", "palaestra.rewards")


def score(fn: RewardFn, sample: Any, completion: str, **info) -> tuple[float, dict]:
    """Call a reward; normalize its result to ``(value, info)``; refuse NaN."""
    out = fn(sample, completion, **info)
    value, extra = out if isinstance(out, tuple) else (out, {})
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"reward {getattr(fn, '__name__', fn)!r} returned {value}")
    return value, dict(extra)


def compose(weights: Mapping[str, float]) -> Callable[..., tuple[float, dict]]:
    """One reward: the weighted sum of registered rewards; info holds each part."""
    fns = {name: REWARDS.get(name) for name in weights}

    def combined(sample: Any, completion: str, **info) -> tuple[float, dict]:
        parts = {name: score(fn, sample, completion, **info)[0] for name, fn in fns.items()}
        return sum(weights[n] * v for n, v in parts.items()), parts

    return combined
