"""How each training step's batch is formed around its rollout: a batch rule, the trainer's hook for it.

A rule draws the step's tasks (`BatchRule.draw`, before the rollout) and, once they are played, keeps the rows
that form the batch (`BatchRule.select`, after it). Rules are registered in `BATCH_RULES` as factories
``(cfg, tasks) -> BatchRule`` (`tasks`: the trainer's `TaskSampler`) and chosen by name when the trainer is
built: ``Trainer(cfg, tracker, batch_rule="first_finished")``. A package registers its own (entry-point group
``palaestra.batch_rules``, or in the module of its job), as mars registers ``first_finished``, MARS's first rows
to finish; the shared trainer never imports it.

- ``all`` (the default): the tasks the ``task_sampling`` draw gives (rl/task_sampling.py), every row kept.

Evaluations do not go through the rule: they play their own fixed tasks, every episode whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from palaestra.shared.registry import Registry
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.task_sampling import TaskSampler
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutResult


class BatchRule(Protocol):
    def draw(self, step: int) -> list[EpisodeSpec]:
        """Step `step`'s tasks: a function of the config and the step (rollouts may be drawn ahead of need)."""
        ...

    def select(self, step: int, result: RolloutResult) -> RolloutResult:
        """The rows of step `step`'s batch, out of the rollout of ``draw(step)``."""
        ...


BatchRuleFactory = Callable[[TrainConfig, TaskSampler], BatchRule]
BATCH_RULES: Registry[BatchRuleFactory] = Registry("batch rule", "palaestra.batch_rules")


@BATCH_RULES.register("all")
class AllRows:
    """The sampler's tasks, every row they play kept."""

    def __init__(self, cfg: TrainConfig, tasks: TaskSampler):
        self.tasks = tasks

    def draw(self, step: int) -> list[EpisodeSpec]:
        return self.tasks.draw(step)

    def select(self, step: int, result: RolloutResult) -> RolloutResult:
        return result


def make_batch_rule(name: str, cfg: TrainConfig, tasks: TaskSampler) -> BatchRule:
    """The rule registered as `name`, built for this run."""
    return BATCH_RULES.get(name)(cfg, tasks)
