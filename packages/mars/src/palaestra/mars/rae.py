"""SPIRAL's role-conditioned advantage estimation (RAE), MARS's main self-play baseline.

SPIRAL (spiral-rl/spiral, ``train_spiral.py`` ``prepare_trajectories``, ``spiral/utils.py`` ``EMA``) keeps one
exponential moving average b of returns per role. For each trajectory in turn it reads b, then updates
b <- decay * b + (1 - decay) * R, and uses R - b (the value read before the update) as the advantage of every
turn. The baseline starts at 0. SPIRAL plays one game per run; here each (game, seat) has its own baseline,
as MARS's comparison trains on several games at once.

``rae`` is an advantage estimator (`ADVANTAGES`, registered by `palaestra.mars.plugins`); it starts a
pipeline. Its baselines live in `BASELINES` across training steps, in the trainer's process. ``mars.train``
resets them when a run starts. They are not in the trainer's checkpoints: a resumed run starts them at 0.
"""

from __future__ import annotations

import numpy as np

from palaestra.shared.rl.advantages import AdvantageInput, Values


class RoleBaselines:
    """One moving average of returns per (game, seat), starting at 0."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    @staticmethod
    def key(env_type: str, agent: str) -> str:
        return f"{env_type}/{agent}"

    def advantage(self, key: str, ret: float, decay: float) -> float:
        """R minus the baseline read before this return updates it (SPIRAL's order: an unbiased baseline)."""
        baseline = self.values.get(key, 0.0)
        self.values[key] = decay * baseline + (1.0 - decay) * ret
        return ret - baseline

    def reset(self) -> None:
        self.values.clear()

    def state_dict(self) -> dict[str, float]:
        return dict(self.values)

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.values = {str(k): float(v) for k, v in state.items()}


BASELINES = RoleBaselines()
"""The baselines of the running training job (the trainer computes advantages in one process)."""


def rae(values: Values | None, batch: AdvantageInput, *, decay: float = 0.95) -> Values:
    """R - b per trajectory (R its total reward), b its (game, seat)'s moving average; on every turn."""
    if values is not None:
        raise ValueError("advantage step 'rae' starts a pipeline (it reads rewards); put it first")
    if not 0.0 < decay < 1.0:
        raise ValueError(f"rae: decay must lie in (0, 1), got {decay}")
    out = []
    for rewards, env_type, agent in zip(batch.turn_rewards, batch.env_types, batch.agents):
        adv = BASELINES.advantage(RoleBaselines.key(env_type, agent), float(rewards.sum()), decay)
        out.append(np.full(len(rewards), adv))
    return out
