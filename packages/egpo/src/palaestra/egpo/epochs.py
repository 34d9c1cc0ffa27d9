"""Epochs over the task data: passes without replacement (the EGPO paper trains "5 epochs" in verl).

The shared trainer draws each step's tasks with replacement (`Trainer.draw_tasks`: an env by mixture weight,
a random reset seed). `EpochTrainer` draws them as verl's dataloader does: every task of every env once per
epoch, in an order shuffled per epoch from ``(seed, epoch)``; step ``k`` takes the next ``tasks_per_step``
of that sequence (an epoch's tail continues into the next one's head). A task is an ``(env, index)`` pair;
its reset seed is the index, which the task envs play as their sample ``index % count``.

`epoch_steps` turns ``epochs`` into a step count: ``ceil(epochs * tasks / tasks_per_step)``.

>>> epoch_steps(epochs=5, num_tasks=17_000, tasks_per_step=128)
665
"""

from __future__ import annotations

import functools
import math
import random

from palaestra.shared.rl.episodes import make_env
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import EpisodeSpec


def epoch_steps(epochs: int, num_tasks: int, tasks_per_step: int) -> int:
    """Steps for `epochs` passes over `num_tasks` tasks at `tasks_per_step` per step."""
    if epochs <= 0 or num_tasks <= 0 or tasks_per_step <= 0:
        raise ValueError(f"epochs, tasks and tasks_per_step must be > 0 (got {epochs}, {num_tasks}, {tasks_per_step})")
    return math.ceil(epochs * num_tasks / tasks_per_step)


def task_count(env) -> int:
    """How many distinct tasks an env plays (`TaskEnv`: its samples; others: a ``num_tasks`` attribute)."""
    count = getattr(env, "num_tasks", None)
    if count is None:
        count = len(getattr(env, "samples", None) or [])
    if not count:
        raise ValueError(f"epochs: env {type(env).__name__} does not say how many tasks it has (num_tasks)")
    return int(count)


class EpochTrainer(Trainer):
    """The shared trainer with tasks drawn in epochs, without replacement (`cfg.envs` counted once at start)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.task_counts = [task_count(make_env(e.name, dict(e.kwargs))) for e in self.cfg.envs]
        self._orders: dict[int, list[tuple[int, int]]] = {}

    @property
    def num_tasks(self) -> int:
        return sum(self.task_counts)

    def epoch_order(self, epoch: int) -> list[tuple[int, int]]:
        """Every ``(env index, task index)`` once, shuffled from ``(seed, epoch)``."""
        if epoch not in self._orders:
            order = [(e, i) for e, count in enumerate(self.task_counts) for i in range(count)]
            random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}  # one epoch at a time is enough: steps move forward
        return self._orders[epoch]

    def draw_tasks(self, step: int) -> list[EpisodeSpec]:
        per_step, total = self.cfg.tasks_per_step, self.num_tasks
        specs = []
        for k in range(step * per_step, (step + 1) * per_step):
            env_index, index = self.epoch_order(k // total)[k % total]
            env = self.cfg.envs[env_index]
            make = functools.partial(make_env, env.name, dict(env.kwargs))
            specs.append(EpisodeSpec(make, index, f"{step}-{k - step * per_step}"))
        return specs
