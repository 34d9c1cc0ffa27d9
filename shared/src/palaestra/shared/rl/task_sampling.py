"""How the trainer draws each step's tasks (``task_sampling``), and the run's length that follows from it.

- ``replacement`` (`episodes.draw_tasks`): each task draws an env by mixture weight and a random reset seed;
  the run is ``steps`` steps.
- ``epochs``: as verl's dataloader (the EGPO paper trains "5 epochs"): every task of every env once per
  epoch, in an order shuffled per epoch from ``(seed, epoch)``; step ``k`` takes the next ``tasks_per_step``
  of that sequence (an epoch's tail continues into the next one's head). A task is an ``(env, index)``
  pair; its reset seed is the index, which the task envs play as their sample ``index % count``. With
  ``epochs`` > 0 the run is ``ceil(epochs * tasks / tasks_per_step)`` steps (`epoch_steps`), else ``steps``.

>>> epoch_steps(epochs=5, num_tasks=17_000, tasks_per_step=128)
665
"""

from __future__ import annotations

import functools
import math
import random

from palaestra.shared.rl.config import TaskSampling, TrainConfig
from palaestra.shared.rl.episodes import draw_tasks, make_env
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
        raise ValueError(
            f"task_sampling=epochs: env {type(env).__name__} does not say how many tasks it has (num_tasks)"
        )
    return int(count)


class TaskSampler:
    """This run's draw of tasks (``cfg.task_sampling``); with ``epochs`` the envs are built once to count tasks."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.task_counts: list[int] = []
        if cfg.task_sampling == TaskSampling.epochs:
            self.task_counts = [task_count(make_env(e.name, dict(e.kwargs))) for e in cfg.envs]
        self._orders: dict[int, list[tuple[int, int]]] = {}

    @property
    def num_tasks(self) -> int:
        """Distinct tasks of all envs (``epochs``; 0 with ``replacement``, which does not count them)."""
        return sum(self.task_counts)

    def steps(self) -> int:
        """The run's RL steps: ``cfg.steps``, or with ``epochs`` > 0 the steps of that many passes."""
        if self.cfg.task_sampling == TaskSampling.epochs and self.cfg.epochs > 0:
            return epoch_steps(self.cfg.epochs, self.num_tasks, self.cfg.tasks_per_step)
        return self.cfg.steps

    def epoch_order(self, epoch: int) -> list[tuple[int, int]]:
        """Every ``(env index, task index)`` once, shuffled from ``(seed, epoch)``."""
        if epoch not in self._orders:
            order = [(e, i) for e, count in enumerate(self.task_counts) for i in range(count)]
            random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}  # one epoch at a time is enough: steps move forward
        return self._orders[epoch]

    def draw(self, step: int) -> list[EpisodeSpec]:
        """The tasks of step `step` (a function of the config and the step)."""
        if self.cfg.task_sampling != TaskSampling.epochs:
            return draw_tasks(self.cfg, step)
        per_step, total = self.cfg.tasks_per_step, self.num_tasks
        specs = []
        for k in range(step * per_step, (step + 1) * per_step):
            env_index, index = self.epoch_order(k // total)[k % total]
            env = self.cfg.envs[env_index]
            make = functools.partial(make_env, env.name, dict(env.kwargs))
            specs.append(EpisodeSpec(make, index, f"{step}-{k - step * per_step}"))
        return specs
