"""Two advantage steps for the estimator ablation where turns carry their own rewards (`ADVANTAGES`).

- ``episode_return`` starts a pipeline: every turn of a trajectory gets the trajectory's total reward (the
  episode-level return; ``turn_level`` is its turn-level counterpart, the returns to go).
- ``batch_norm`` transforms: (x - mean) / (std + eps) over every turn of the batch, each turn once, all seats
  and games pooled. With ``rollout.group_size`` 1 this is MARS's GRPO baseline, which normalizes over the batch
  (shared ``grpo`` centres within groups of plays of one task first, and a group of one gives 0).

So the arms are (episode | turn) returns x (batch | agent) normalization. Both are registered by
`palaestra.mars.plugins`.
"""

from __future__ import annotations

import numpy as np

from palaestra.shared.rl.advantages import AdvantageInput, Values


def episode_return(values: Values | None, batch: AdvantageInput) -> Values:
    """The trajectory's total reward on each of its turns."""
    if values is not None:
        raise ValueError("advantage step 'episode_return' starts a pipeline (it reads rewards); put it first")
    return [np.full(len(r), float(r.sum())) for r in batch.turn_rewards]


def batch_norm(values: Values | None, batch: AdvantageInput, *, eps: float = 1e-6) -> Values:
    """Normalize over all turns of the batch (std with n - 1; all equal, or one turn: 0)."""
    if values is None:
        raise ValueError("advantage step 'batch_norm' transforms values: put episode_return or turn_level first")
    pooled = np.concatenate([*values, np.zeros(0)])
    if len(pooled) < 2:
        return [np.zeros_like(v, dtype=np.float64) for v in values]
    mean, std = pooled.mean(), pooled.std(ddof=1)
    if std + eps <= 0:
        return [np.zeros_like(v, dtype=np.float64) for v in values]
    return [(v - mean) / (std + eps) for v in values]
