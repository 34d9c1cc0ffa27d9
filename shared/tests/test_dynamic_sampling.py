"""DAPO's dynamic sampling (rl/dynamic_sampling.py): groups of all-equal rewards dropped, more tasks drawn, capped.

The reference counts are recomputed here from every rollout the trainer played (numpy's peak-to-peak per group),
not with the module's own helpers.
"""

import logging
from collections import defaultdict

import numpy as np
import pytest
import torch

from palaestra.shared.config import ConfigError, resolve
from palaestra.shared.rewards import REWARDS
from palaestra.shared.rl.config import PolicySpec, TrainConfig
from palaestra.shared.rl.dynamic_sampling import DynamicSamplingConfig
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import RolloutConfig
from palaestra.shared.testing import small_train_config


@REWARDS.register("dynsamp_test_parity")
def _parity(sample, completion, **info) -> float:
    """0 for every task whose answer is odd (an all-0 group); the completion's length otherwise (mixed mostly)."""
    return 0.0 if int(sample["answer"]) % 2 else len(completion) / 10


@REWARDS.register("dynsamp_test_zero")
def _zero(sample, completion, **info) -> float:
    return 0.0


def _config(tmp_path, reward, **kw):
    torch.manual_seed(0)
    base = dict(tasks_per_step=4, steps=2)
    return small_train_config(tmp_path, reward, **{**base, **kw})


def _recording(trainer):
    """Every rollout the trainer plays (the step's own and the extra draws), and the rows each update gets."""
    trainer.prepare()
    played, trained = [], []
    run, update = trainer.rollouts.run, trainer.update_policy

    def record_run(specs, seed, cfg=None):
        result = run(specs, seed, cfg)
        played.append(result)
        return result

    def record_update(policy, trajs):
        trained.append(list(trajs))
        return update(policy, trajs)

    trainer.rollouts.run, trainer.update_policy = record_run, record_update
    return played, trained


def _spread_by_group(results):
    """Per group id, the peak-to-peak of its rewards (an independent count: numpy, every trajectory)."""
    rewards = defaultdict(list)
    for result in results:
        for t in result.trajectories:
            rewards[t.group_id].append(t.total_reward)
    return {g: float(np.ptp(r)) for g, r in rewards.items()}


def test_kept_groups_are_mixed_and_the_logged_counts_match_the_drawn_rewards(tmp_path):
    cfg = _config(tmp_path, "dynsamp_test_parity", dynamic_sampling=DynamicSamplingConfig(enabled=True))
    with Trainer(cfg) as trainer:
        played, trained = _recording(trainer)
        dropped_total = 0
        for _ in range(cfg.steps):
            before = len(played)
            metrics = trainer.train_step()
            spread = _spread_by_group(played[before:])
            dropped = sum(v == 0 for v in spread.values())
            assert metrics["batch/groups_drawn"] == len(spread) == 4 * metrics["batch/draws"]
            assert metrics["batch/groups_dropped"] == dropped
            assert metrics["batch/groups_dropped_share"] == pytest.approx(dropped / len(spread))
            assert metrics["batch/draws"] == len(played) - before
            assert metrics["batch/groups_padded"] == 0  # the cap (3 extra draws) is not reached here
            rows = trained[-1]
            kept = {t.group_id for t in rows}
            assert len(kept) == cfg.tasks_per_step and all(spread[g] > 0 for g in kept)
            assert len(rows) == cfg.tasks_per_step * cfg.rollout.group_size  # whole groups
            dropped_total += dropped
    assert dropped_total > 0  # the filter had something to drop (else the test proves nothing)


def test_the_cap_stops_the_draws_and_warns_in_one_line(tmp_path, caplog):
    opts = DynamicSamplingConfig(enabled=True, max_extra_draws=2)
    cfg = _config(tmp_path, "dynsamp_test_zero", dynamic_sampling=opts, steps=1)
    with Trainer(cfg) as trainer, caplog.at_level(logging.WARNING, "palaestra.shared.rl.dynamic_sampling"):
        played, trained = _recording(trainer)
        metrics = trainer.train_step()
    assert len(played) == 1 + 2  # the step's own rollout and the two extra draws allowed, no more
    assert metrics["batch/draws"] == 3 and metrics["batch/groups_drawn"] == 12
    assert metrics["batch/groups_dropped"] == 12 and metrics["batch/groups_dropped_share"] == 1.0
    assert metrics["batch/groups_padded"] == 4  # the batch keeps its size, with the first dropped groups
    assert {t.group_id for t in trained[-1]} == {t.group_id for t in played[0].trajectories}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0] and "max_extra_draws" in warnings[0]


def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.policies[0].model.state_dict().items()}


def test_off_the_step_is_bit_identical_to_the_step_without_dynamic_sampling(tmp_path):
    """Off (the default): the same batch, metrics and weights as the loop before the option (the rule's rows)."""
    runs = []
    for name, bypass in (("off", False), ("without", True)):
        with Trainer(_config(tmp_path / name, "dynsamp_test_parity")) as trainer:
            assert not trainer.cfg.dynamic_sampling.enabled
            if bypass:  # today's line: the batch rule's rows of the step's rollout, nothing else
                trainer.dynamic.fill = lambda step, played, rollouts, rule: (rule.select(step, played), {})
            played, trained = _recording(trainer)
            metrics = [trainer.train_step() for _ in range(2)]
            runs.append((metrics, trained, _weights(trainer)))
    (m_off, t_off, w_off), (m_ref, t_ref, w_ref) = runs
    timing = ("perf/", "batch/mixed_groups_share", "batch/pass_at_k")  # the latter two: logged on or off
    for a, b in zip(m_off, m_ref, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(timing)} == {
            k: v for k, v in b.items() if not k.startswith(timing)
        }
        assert not any(k.startswith("batch/") and not k.startswith(timing) for k in a)
    for a, b in zip(t_off, t_ref, strict=True):
        assert [(t.group_id, t.total_reward, t.turns[-1].text) for t in a] == [
            (t.group_id, t.total_reward, t.turns[-1].text) for t in b
        ]
    assert w_off.keys() == w_ref.keys() and all(torch.equal(w_off[k], w_ref[k]) for k in w_off)
    # negative control: training changed the weights, so equal weights are not vacuous
    with Trainer(_config(tmp_path / "fresh", "dynsamp_test_parity")) as fresh:
        start = _weights(fresh)
    assert any(not torch.equal(start[k], w_off[k]) for k in start)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"rollout": {"group_size": 1}}, "needs rollout.group_size >= 2"),
        ({"rollout": {"group_size": 4, "max_staleness": 1}}, "not supported with rollouts ahead"),
        ({"rollout": {"group_size": 4}, "dynamic_sampling": {"max_extra_draws": 0}}, "unlimited is not allowed"),
        ({"rollout": {"group_size": 4}, "dynamic_sampling": {"tolerance": -1.0}}, "tolerance must be >= 0"),
    ],
)
def test_a_combination_it_cannot_run_is_refused_at_resolve_time_in_one_line(data, message):
    data = {"job": "rl.train", **data}
    data["dynamic_sampling"] = {"enabled": True, **data.get("dynamic_sampling", {})}
    with pytest.raises(ConfigError, match=message) as err:
        resolve(TrainConfig, data)
    assert "\n" not in str(err.value) and "dynamic_sampling" in str(err.value)
    data["dynamic_sampling"]["enabled"] = False  # off: the same settings are fine
    resolve(TrainConfig, data)


def test_several_policies_are_refused_and_group_size_one_is_fine_when_off(tmp_path):
    both = {"a": PolicySpec(agents=["agent"]), "b": PolicySpec()}
    on = DynamicSamplingConfig(enabled=True)
    with pytest.raises(ConfigError, match="not supported with several policies"):
        Trainer(_config(tmp_path, "exact_answer", dynamic_sampling=on, policies=both))  # a config built in code
    Trainer(_config(tmp_path, "exact_answer", rollout=RolloutConfig(group_size=1, max_tokens_per_turn=5))).close()


@pytest.mark.parametrize("sampling", ["replacement", "epochs"])
def test_extra_draws_are_new_tasks_fixed_by_seed_step_and_draw(tmp_path, sampling):
    from palaestra.shared.rl.dynamic_sampling import DynamicSampler
    from palaestra.shared.rl.task_sampling import TaskSampler

    cfg = _config(tmp_path, "exact_answer", task_sampling=sampling, tasks_per_step=5)
    sampler = DynamicSampler(cfg, TaskSampler(cfg))
    first, again, other = sampler.extra_tasks(3, 1), sampler.extra_tasks(3, 1), sampler.extra_tasks(3, 2)
    assert [(s.group_id, s.seed) for s in first] == [(s.group_id, s.seed) for s in again]  # resumes draw the same
    assert [s.seed for s in first] != [s.seed for s in other]
    ids = [s.group_id for d in (first, other) for s in d] + [s.group_id for s in TaskSampler(cfg).draw(3)]
    assert len(ids) == len(set(ids))  # never a group id of the step's own tasks: groups stay apart
    if sampling == "epochs":  # distinct tasks of the env (8 samples), each a valid index
        assert len({s.seed for s in first}) == 5 and all(0 <= s.seed < 8 for s in first)
