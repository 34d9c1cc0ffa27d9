"""The trainer's batch-rule hook (rl/batch_rules.py): the default is today's loop; a registered rule forms the batch."""

import pytest
import torch

from palaestra.shared.registry import UnknownNameError
from palaestra.shared.rl.batch_rules import BATCH_RULES, AllRows
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.episodes import draw_tasks
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import RolloutResult
from palaestra.shared.testing import small_train_config


def small_config(tmp_path, **kw) -> TrainConfig:
    return small_train_config(tmp_path, "exact_answer", **kw)


def test_default_rule_draws_the_samplers_tasks_and_keeps_every_row(tmp_path):
    trainer = Trainer(small_config(tmp_path))
    assert isinstance(trainer.batch_rule, AllRows)
    for step in (0, 3):
        got, want = trainer.draw_tasks(step), draw_tasks(trainer.cfg, step)  # the mixture draw, as before the hook
        assert [(s.group_id, s.seed) for s in got] == [(s.group_id, s.seed) for s in want]
    result = RolloutResult([], {"generated_tokens": 0})
    assert trainer.batch_rule.select(0, result) is result


class KeepFirstTwo:
    """A rule written for the test: one fixed task per step, of whose rows the first two form the batch."""

    calls: list = []

    def __init__(self, cfg, tasks):
        self.tasks = tasks

    def draw(self, step):
        return self.tasks.draw(step)[:1]

    def select(self, step, result):
        KeepFirstTwo.calls.append((step, len(result.trajectories)))
        return RolloutResult(result.trajectories[:2], result.stats)


def test_a_registered_rule_draws_the_tasks_and_selects_the_rows_the_step_trains_on(tmp_path):
    torch.manual_seed(0)
    BATCH_RULES.register("test_keep_first_two", KeepFirstTwo)
    KeepFirstTwo.calls = []
    try:
        trainer = Trainer(small_config(tmp_path, steps=1), batch_rule="test_keep_first_two")
        metrics = trainer.train_step()
    finally:
        trainer.close()
        BATCH_RULES.unregister("test_keep_first_two")
    # one task x group_size 3 played, the first two of them trained on
    assert KeepFirstTwo.calls == [(0, 3)]
    assert metrics["rollout/trajectories"] == 2


def test_an_unknown_rule_is_named_with_the_nearest():
    with pytest.raises(UnknownNameError, match="unknown batch rule 'al'"):
        BATCH_RULES.get("al")
