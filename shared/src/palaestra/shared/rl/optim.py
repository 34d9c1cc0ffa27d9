"""The learner's optimizer: AdamW built from `OptimConfig`, and its learning rate at each step.

The schedule (linear warmup from 0, then constant or cosine toward ``min_lr``) is a function of the step
alone, so a resumed run and every rank of a sharded learner get the same rate with no scheduler state to
save. ``optim.schedule_unit`` says which step it counts:

- ``rl_step``: the rate of RL step s of the run's ``steps``, the same for all of that step's optimizer steps;
- ``optimizer_step``: the rate of the k-th optimizer step of RL step s is the schedule at
  ``s * per_step + k`` of ``steps * per_step``, ``per_step = ppo_epochs * ceil(rows / minibatch_size)``
  (`optimizer_steps`), so warmup counts optimizer steps and the cosine ends at the run's last optimizer
  step: ROLL's scheduler (MARS), stepped once per optimizer step over ``max_steps`` optimizer steps. Where
  the rows of a step vary (failed rollouts dropped), ``per_step`` is that step's own count.

The two agree where each RL step makes one optimizer step. The learner sets the rate before every
optimizer step (`step_learning_rate`, rl/update.py's ``ppo_update``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from palaestra.shared.rl.config import LRSchedule, OptimConfig, ScheduleUnit, TrainConfig


def make_optimizer(params: Iterable[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.AdamW:
    betas = (float(optim.betas[0]), float(optim.betas[1]))
    return torch.optim.AdamW(list(params), lr=optim.lr, betas=betas, weight_decay=optim.weight_decay)


def learning_rate(optim: OptimConfig, step: int, steps: int) -> float:
    """The rate of step ``step`` (0-based) of ``steps``: ``lr * step / warmup_steps`` during warmup (0 at the
    first step), then ``lr`` (constant) or ``min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2`` (cosine),
    ``progress = (step - warmup_steps) / (steps - warmup_steps)`` (HF's cosine-with-warmup formula)."""
    if step < optim.warmup_steps:
        return optim.lr * step / optim.warmup_steps
    if optim.schedule == LRSchedule.constant:
        return optim.lr
    progress = min(1.0, (step - optim.warmup_steps) / max(1, steps - optim.warmup_steps))
    return optim.min_lr + (optim.lr - optim.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def optimizer_steps(cfg: TrainConfig, rows: int) -> int:
    """Optimizer steps of one RL step over `rows` trajectories: ``ppo_epochs`` x minibatches."""
    return cfg.ppo_epochs * math.ceil(rows / (cfg.minibatch_size or rows))


def step_learning_rate(cfg: TrainConfig, step: int, steps: int, k: int = 0, per_step: int = 1) -> float:
    """The rate of the `k`-th of `per_step` optimizer steps of RL step `step` of `steps` (see the module
    docstring)."""
    if cfg.optim.schedule_unit == ScheduleUnit.optimizer_step:
        return learning_rate(cfg.optim, step * per_step + k, steps * per_step)
    return learning_rate(cfg.optim, step, steps)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
