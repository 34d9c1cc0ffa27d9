"""SPIRAL's role-conditioned advantage estimation (RAE), MARS's main self-play baseline.

SPIRAL (spiral-rl/spiral, ``train_spiral.py`` ``prepare_trajectories``, ``spiral/utils.py`` ``EMA``) keeps one
exponential moving average b of returns per role. For each trajectory in turn it reads b, then updates
b <- decay * b + (1 - decay) * R, and uses R - b (the value read before the update) as the advantage of every
turn. The baseline starts at 0. SPIRAL plays one game per run; here each (game, seat) has its own baseline,
as MARS's comparison trains on several games at once.

``rae`` is an advantage estimator (`ADVANTAGES`, registered by `palaestra.mars.plugins`); it starts a
pipeline. Its baselines live in `BASELINES` across training steps, in the trainer's process. ``mars.train``
resets them when a run starts and attaches a file beside the checkpoints (``rae_baselines.json``): after each
step's batch the baselines are written there under that step. A resumed run at checkpoint step S restores the
baselines written under step S - 1, the last step the checkpoint holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from palaestra.shared.rl.advantages import AdvantageInput, Values


class RoleBaselines:
    """One moving average of returns per (game, seat), starting at 0."""

    KEEP = 8
    """Steps kept in the file (a checkpoint is never older than the last few steps)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.path: Path | None = None
        self.clock: Callable[[], int] | None = None

    def attach(self, path: str | Path, clock: Callable[[], int]) -> None:
        """Write the baselines to `path` after each batch, under the step `clock()` reads (the trainer's)."""
        self.path, self.clock = Path(path), clock

    def end_batch(self) -> None:
        """The batch is done: record the baselines under the current step (when attached)."""
        if self.path is None or self.clock is None:
            return
        history = self._history()
        history[str(self.clock())] = self.state_dict()
        kept = dict(sorted(history.items(), key=lambda kv: int(kv[0]))[-self.KEEP :])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(kept))
        tmp.replace(self.path)  # atomic: a killed run leaves the previous file whole

    def restore(self, step: int) -> None:
        """The baselines after step `step` - 1 (what a checkpoint at `step` holds); 0: none yet."""
        if step <= 0:
            self.values.clear()
            return
        saved = self._history().get(str(step - 1))
        if saved is None:
            raise ValueError(f"rae: no baselines for step {step - 1} in {self.path}; cannot resume RAE exactly")
        self.load_state_dict(saved)

    def _history(self) -> dict[str, dict[str, float]]:
        if self.path is None or not self.path.is_file():
            return {}
        return json.loads(self.path.read_text())

    @staticmethod
    def key(env_type: str, agent: str) -> str:
        return f"{env_type}/{agent}"

    def advantage(self, key: str, ret: float, decay: float) -> float:
        """R minus the baseline read before this return updates it (SPIRAL's order: an unbiased baseline)."""
        baseline = self.values.get(key, 0.0)
        self.values[key] = decay * baseline + (1.0 - decay) * ret
        return ret - baseline

    def reset(self) -> None:
        """Baselines at 0, detached from any file."""
        self.values.clear()
        self.path = self.clock = None

    def forget(self) -> None:
        """A fresh run: remove an earlier run's file, so its steps cannot be restored by mistake."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)

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
    BASELINES.end_batch()
    return out
