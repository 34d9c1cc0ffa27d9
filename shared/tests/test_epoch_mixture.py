"""The env mixture under epoch sampling (rl/task_sampling.py ``epoch_mixture``) and the per-step source share.

Reference counts are closed forms of the weights (N w_e / sum(w), rounded by largest remainder) and are read back
from the drawn specs' own env arguments or the trajectories' ``env_type``, not through the module's helpers.
"""

from collections import Counter

import pytest
import torch

from palaestra.shared.config import ConfigError, check_fields, resolve
from palaestra.shared.rl.config import EnvSpec, TrainConfig
from palaestra.shared.rl.dynamic_sampling import DynamicSamplingConfig
from palaestra.shared.rl.task_sampling import TaskSampler, mixture_sizes
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import RolloutConfig
from palaestra.shared.testing import small_train_config


def _env(count: int, weight: float, env_type: str) -> EnvSpec:
    kwargs = {"source_kwargs": {"num_samples": count}, "env_type": env_type}
    return EnvSpec("task", kwargs, weight)


def _config(tmp_path, counts, weights, mixture="weights", **kw):
    envs = [_env(c, w, f"src{i}") for i, (c, w) in enumerate(zip(counts, weights, strict=True))]
    base = dict(envs=envs, task_sampling="epochs", epoch_mixture=mixture, epochs=3, tasks_per_step=8)
    return small_train_config(tmp_path, "exact_answer", **{**base, **kw})


def _epoch_draws(sampler, epoch):
    """(env's ``env_type``, task index) of every task of epoch `epoch` (N / tasks_per_step whole steps)."""
    steps = sampler.num_tasks // sampler.cfg.tasks_per_step
    specs = [s for step in range(epoch * steps, (epoch + 1) * steps) for s in sampler.draw(step)]
    return [(s.make_env.args[1]["env_type"], s.seed) for s in specs]


def test_each_epochs_shares_are_the_weights_and_tasks_are_covered_without_replacement(tmp_path):
    sampler = TaskSampler(_config(tmp_path, [30, 10], [1.0, 3.0]))
    assert sampler.task_counts == [30, 10] and sampler.num_tasks == 40  # the epoch keeps N = 40 places
    seen_small = Counter()
    for epoch in range(3):
        draws = _epoch_draws(sampler, epoch)
        per_env = Counter(env for env, _ in draws)
        assert per_env == {"src0": 10, "src1": 30}  # 40 x 1/4 and 40 x 3/4: the weights' shares, exactly
        # the over-weighted env (10 tasks, 30 places) plays each of its tasks 3 times per epoch
        assert Counter(i for env, i in draws if env == "src1") == dict.fromkeys(range(10), 3)
        seen_small.update(i for env, i in draws if env == "src0")
    # the under-weighted env (30 tasks, 10 places an epoch): every task once in 3 epochs, none twice
    assert seen_small == dict.fromkeys(range(30), 1)


def test_shares_that_do_not_divide_are_the_weights_within_rounding(tmp_path):
    assert mixture_sizes(40, [1.0, 1.0, 1.0]) == [14, 13, 13]  # 13.33 each; the one left goes to the first
    assert mixture_sizes(7, [0.5, 0.25, 0.25]) == [3, 2, 2]  # 3.5 1.75 1.75: floors 3 1 1, then the .75s
    sampler = TaskSampler(_config(tmp_path, [20, 10, 10], [1.0, 1.0, 1.0]))
    draws = _epoch_draws(sampler, 0)
    per_env = Counter(env for env, _ in draws)
    assert per_env == {"src0": 14, "src1": 13, "src2": 13}
    assert all(abs(n - 40 / 3) < 1 for n in per_env.values())


def test_negative_control_counts_gives_the_task_counts_share_and_refuses_unequal_weights(tmp_path):
    sampler = TaskSampler(_config(tmp_path, [30, 10], [1.0, 1.0], mixture="counts"))
    draws = _epoch_draws(sampler, 0)
    assert Counter(env for env, _ in draws) == {"src0": 30, "src1": 10}  # each task once: 3/4, 1/4, not the weights
    with pytest.raises(ConfigError, match="would ignore the env weights") as err:
        check_fields(_config(tmp_path, [30, 10], [1.0, 3.0], mixture="counts"))  # as Trainer() and --dry-run do
    assert "\n" not in str(err.value) and "epoch_mixture" in str(err.value)
    data = {"job": "rl.train", "epoch_mixture": "weights", "task_sampling": "replacement"}
    with pytest.raises(ConfigError, match="needs task_sampling: epochs"):
        resolve(TrainConfig, data)
    with pytest.raises(ConfigError, match="epoch_mixture"):
        resolve(TrainConfig, {"job": "rl.train", "epoch_mixture": "weight"})


@pytest.mark.parametrize("dynamic", [False, True])
def test_each_step_logs_the_batch_share_per_source(tmp_path, dynamic):
    torch.manual_seed(0)
    opts = DynamicSamplingConfig(enabled=dynamic, max_extra_draws=1)
    cfg = _config(
        tmp_path,
        [6, 6],
        [1.0, 2.0],
        tasks_per_step=4,
        dynamic_sampling=opts,
        rollout=RolloutConfig(group_size=2, max_tokens_per_turn=3),
    )
    trained = []
    with Trainer(cfg) as trainer:
        trainer.prepare()
        update = trainer.update_policy
        trainer.update_policy = lambda p, rows: trained.append(list(rows)) or update(p, rows)
        for _ in range(2):
            metrics = trainer.train_step()
            groups = {t.group_id: t.env_type for t in trained[-1]}
            share = Counter(groups.values())
            assert metrics["batch/source_share/task.0"] == pytest.approx(share["src0"] / len(groups))
            assert metrics["batch/source_share/task.1"] == pytest.approx(share["src1"] / len(groups))
            rewards = {g: [t.total_reward for t in trained[-1] if t.group_id == g] for g in groups}
            mixed = sum(max(r) > min(r) for r in rewards.values()) / len(rewards)
            assert metrics["batch/mixed_groups_share"] == pytest.approx(mixed)
            solved = sum(max(r) >= 1 for r in rewards.values()) / len(rewards)
            assert metrics["batch/pass_at_k"] == pytest.approx(solved)
    # one env: no source share is logged (it would always be 1)
    single = small_train_config(tmp_path / "one", "exact_answer", steps=1)
    with Trainer(single) as trainer:
        assert not any(k.startswith("batch/source_share") for k in trainer.train_step())
