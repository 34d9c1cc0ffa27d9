"""The learner's optimizer: AdamW built from `OptimConfig`, and its learning rate at each RL step.

The schedule is a function of the RL step alone (linear warmup from 0, then constant or cosine toward
``min_lr``), so a resumed run and every rank of a sharded learner get the same rate with no
scheduler state to save. It is set once per RL step, before that step's updates. MARS (ROLL) steps its
scheduler once per optimizer step instead, over ``max_steps`` RL steps divided by the data-parallel size
(``megatron_strategy.py``), so where an RL step makes several optimizer steps its cosine ends early; the two
agree where each RL step makes one optimizer step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from palaestra.shared.rl.config import LRSchedule, OptimConfig


def make_optimizer(params: Iterable[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.AdamW:
    betas = (float(optim.betas[0]), float(optim.betas[1]))
    return torch.optim.AdamW(list(params), lr=optim.lr, betas=betas, weight_decay=optim.weight_decay)


def learning_rate(optim: OptimConfig, step: int, steps: int) -> float:
    """The rate of RL step ``step`` (0-based) of ``steps``: ``lr * step / warmup_steps`` during warmup (0 at the
    first step), then ``lr`` (constant) or ``min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2`` (cosine),
    ``progress = (step - warmup_steps) / (steps - warmup_steps)`` (HF's cosine-with-warmup formula)."""
    if step < optim.warmup_steps:
        return optim.lr * step / optim.warmup_steps
    if optim.schedule == LRSchedule.constant:
        return optim.lr
    progress = min(1.0, (step - optim.warmup_steps) / max(1, steps - optim.warmup_steps))
    return optim.min_lr + (optim.lr - optim.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
