"""The pilot pass (rl/pilot.py): the tasks kept are those whose groups have mixed rewards, cached and resumable.

The reward below makes the keep set a closed form of the task data: ``next_number``'s 8 samples (answers 3 4 5 6
6 7 8 9) score 0 when the answer is odd, 1 when it is a multiple of 4, and alternate 0, 1, 0, ... per prompt
otherwise (mixed in every group of >= 2). So tasks 3 and 4 (answers 6, 6) are kept, 0 2 5 7 are all 0 and 1 6 all
1. The expected sets are computed here from the samples, not with the module's helpers.
"""

import json
import math
from collections import Counter

import pytest
import torch

import palaestra.shared.rl.pilot as pilot
from palaestra.shared.config import ConfigError, resolve
from palaestra.shared.rewards import REWARDS
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.pilot import PilotConfig, PilotError
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import RolloutConfig
from palaestra.shared.rollout.tasks import next_number
from palaestra.shared.testing import small_train_config

CALLS: Counter = Counter()


@REWARDS.register("pilot_test_reward")
def _reward(sample, completion, **info) -> float:
    answer = int(sample["answer"])
    if answer % 2:
        return 0.0
    if answer % 4 == 0:
        return 1.0
    key = sample["messages"][-1]["content"]
    CALLS[key] += 1
    return float(CALLS[key] % 2)


@REWARDS.register("pilot_test_zero")
def _zero(sample, completion, **info) -> float:
    return 0.0


def expected():
    """(kept, all 0, all 1) task indices, from the samples' answers."""
    samples = next_number()
    assert len({s["messages"][-1]["content"] for s in samples}) == len(samples)  # the alternation is per task
    answers = [int(s["answer"]) for s in samples]
    zero = {i for i, a in enumerate(answers) if a % 2}
    one = {i for i, a in enumerate(answers) if a % 4 == 0}
    kept = set(range(len(answers))) - zero - one
    assert kept and zero and one  # the three kinds all occur (else the test proves little)
    return kept, zero, one


def _config(tmp_path, reward="pilot_test_reward", **pilot_kw):
    torch.manual_seed(0)
    opts = PilotConfig(**{"enabled": True, "samples": 4, "chunk_tasks": 3, **pilot_kw})
    rollout = RolloutConfig(group_size=3, max_tokens_per_turn=5)
    return small_train_config(
        tmp_path, reward, pilot=opts, rollout=rollout, task_sampling="epochs", epochs=2, tasks_per_step=3
    )


def _run(cfg, monkeypatch):
    """Prepare a trainer (the pilot runs there); returns it, the pilot's metrics and how many chunks it played."""
    played, metrics = [], {}
    play, run = pilot.play_chunk, pilot.run_pilot

    def counting(cfg, rollouts, picks, chunk):
        played.append(chunk)
        return play(cfg, rollouts, picks, chunk)

    def keeping(trainer):
        metrics.update(run(trainer) or {})

    monkeypatch.setattr(pilot, "play_chunk", counting)
    monkeypatch.setattr("palaestra.shared.rl.trainer.run_pilot", keeping)
    trainer = Trainer(cfg)
    trainer.prepare()
    return trainer, metrics, played


def test_the_kept_tasks_are_the_mixed_ones_and_training_draws_only_them(tmp_path, monkeypatch):
    kept, zero, one = expected()
    trainer, metrics, played = _run(_config(tmp_path), monkeypatch)
    with trainer:
        assert trainer.tasks.pools == [sorted(kept)]
        assert metrics["pilot/candidates"] == 8 and metrics["pilot/kept"] == len(kept)
        assert metrics["pilot/all_equal_zero"] == len(zero) and metrics["pilot/all_equal_nonzero"] == len(one)
        assert metrics["pilot/played"] == 8 and played == [0, 1, 2]  # chunks of 3, 3, 2 tasks
        # the run is 2 epochs over the kept tasks: ceil(2 x 2 / 3) = 2 steps, drawing only kept tasks
        assert trainer.total_steps == math.ceil(2 * len(kept) / 3) == 2
        drawn = [s.seed for step in range(trainer.total_steps) for s in trainer.draw_tasks(step)]
        assert Counter(drawn) == dict.fromkeys(kept, 3)  # 6 draws: 3 passes over the 2 kept tasks
        trainer.train_step()  # a step trains on them
    cache = (tmp_path / "out" / "pilot.jsonl").read_text().splitlines()
    assert len(cache) == 1 + 3 and "fingerprint" in json.loads(cache[0])
    rows = [t for line in cache[1:] for t in json.loads(line)["tasks"]]
    assert all(0 < t["tokens"] <= 4 * 5 for t in rows)  # a group's response tokens: 4 samples of <= 5 tokens


def test_the_cache_resumes_at_the_first_unplayed_chunk_and_refuses_other_settings(tmp_path, monkeypatch):
    kept, _, _ = expected()
    _run(_config(tmp_path), monkeypatch)[0].close()
    path = tmp_path / "out" / "pilot.jsonl"
    lines = path.read_text().splitlines()
    # finished: nothing is played again, the same tasks are kept
    trainer, metrics, played = _run(_config(tmp_path), monkeypatch)
    trainer.close()
    assert played == [] and metrics["pilot/played"] == 0 and trainer.tasks.pools == [sorted(kept)]
    # interrupted after the first chunk, with a torn line: the other two are played, the result is the same
    path.write_text("\n".join(lines[:2]) + '\n{"chunk": 1, "tas')
    trainer, metrics, played = _run(_config(tmp_path), monkeypatch)
    trainer.close()
    assert played == [1, 2] and metrics["pilot/played"] == 5 and trainer.tasks.pools == [sorted(kept)]
    # other settings (more samples): refused in one line
    with pytest.raises(PilotError, match="other settings") as err:
        _run(_config(tmp_path, samples=6), monkeypatch)
    assert "\n" not in str(err.value)


def test_negative_control_equal_rewards_keep_nothing_and_off_keeps_every_task(tmp_path, monkeypatch):
    with pytest.raises(PilotError, match="kept no task of 8") as err:
        _run(_config(tmp_path, "pilot_test_zero"), monkeypatch)
    assert "8 all 0" in str(err.value) and "\n" not in str(err.value)
    cfg = _config(tmp_path / "off")
    cfg.pilot.enabled = False
    trainer, metrics, played = _run(cfg, monkeypatch)
    trainer.close()
    assert played == [] and metrics == {} and trainer.tasks.pools == [list(range(8))] and not trainer.tasks.filtered


def test_with_replacement_the_draws_are_kept_tasks(tmp_path, monkeypatch):
    kept, _, _ = expected()
    cfg = _config(tmp_path)
    cfg.task_sampling, cfg.epochs = "replacement", 0
    trainer, _, _ = _run(cfg, monkeypatch)
    trainer.close()
    drawn = {s.seed for step in range(10) for s in trainer.draw_tasks(step)}
    assert drawn == kept and trainer.total_steps == cfg.steps


@pytest.mark.parametrize(
    "pilot_cfg, message",
    [
        ({"samples": 1}, "samples must be >= 2"),
        ({"candidates": -1}, "candidates must be >= 0"),
        ({"tolerance": -0.5}, "tolerance must be >= 0"),
        ({"chunk_tasks": 0}, "chunk_tasks must be >= 1"),
    ],
)
def test_bad_values_are_refused_at_resolve_time_in_one_line(pilot_cfg, message):
    data = {"job": "rl.train", "pilot": {"enabled": True, **pilot_cfg}}
    with pytest.raises(ConfigError, match=message) as err:
        resolve(TrainConfig, data)
    assert "\n" not in str(err.value) and "pilot" in str(err.value)
    data["pilot"]["enabled"] = False  # off: the same values are not checked
    resolve(TrainConfig, data)


def test_candidates_are_a_seeded_subset():
    every = pilot.candidate_tasks([5, 3], 0, seed=1)
    assert every == [(0, i) for i in range(5)] + [(1, i) for i in range(3)]
    some = pilot.candidate_tasks([5, 3], 4, seed=1)
    assert len(some) == 4 and set(some) < set(every) and some == sorted(some)
    assert some == pilot.candidate_tasks([5, 3], 4, seed=1) and some != pilot.candidate_tasks([5, 3], 4, seed=2)


def test_a_fixed_pilot_seed_shares_one_cache_across_the_runs_seeds(tmp_path, monkeypatch):
    kept, _, _ = expected()
    cache = str(tmp_path / "shared.jsonl")
    first = _config(tmp_path / "a", seed=0, cache=cache)
    _run(first, monkeypatch)[0].close()
    other = _config(tmp_path / "b", seed=0, cache=cache)
    other.seed = 5  # another run seed of the matrix, the same pilot seed: nothing played again
    trainer, metrics, played = _run(other, monkeypatch)
    trainer.close()
    assert played == [] and trainer.tasks.pools == [sorted(kept)]
    unfixed = _config(tmp_path / "c", cache=cache)
    unfixed.seed = 5  # without pilot.seed the run's seed decides: the cache is not this run's
    with pytest.raises(PilotError, match="other settings"):
        _run(unfixed, monkeypatch)
