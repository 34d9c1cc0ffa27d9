"""The trainer's perf metrics say what they measure at every staleness: ``perf/rollout_s`` is the rollout's
own wall time (the engine's), ``perf/learner_wait_s`` how long the learner waited for it, and
``perf/tokens_per_s`` divides the generated tokens by the rollout's time, not by the wait."""

import time

import pytest
import torch

from palaestra.shared.rewards import REWARDS
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import RolloutConfig
from palaestra.shared.testing import small_train_config

torch.set_num_threads(1)


@REWARDS.register("perf_test_length")
def response_length(sample, completion, **info) -> float:
    return len(completion) / 10


def config(tmp_path, k: int):
    rollout = RolloutConfig(group_size=3, max_tokens_per_turn=5, max_staleness=k)
    return small_train_config(tmp_path, "perf_test_length", steps=3, rollout=rollout)


@pytest.mark.parametrize("k", [0, 1])
def test_rollout_time_and_the_learners_wait_are_measured_apart(tmp_path, k):
    """The rollout's own time is set to 123 s and the learner made to wait 0.2 s: the metrics report each
    as it is (the old code logged the wait as the rollout time and divided the tokens by it)."""
    seen = []
    with Trainer(config(tmp_path, k)) as tr:
        tr.prepare()
        stream = tr.stream
        take = stream.take

        def slow_take(step):
            result = take(step)
            result.stats = {**result.stats, "rollout_s": 123.0}
            seen.append(result.stats["generated_tokens"])
            time.sleep(0.2)
            return result

        stream.take = slow_take
        metrics = [tr.train_step() for _ in range(2)]
    for m, tokens in zip(metrics, seen):
        assert m["perf/rollout_s"] == 123.0
        assert m["perf/tokens_per_s"] == pytest.approx(tokens / 123.0)
        assert 0.2 <= m["perf/learner_wait_s"] < 60
        assert m["perf/step_s"] >= m["perf/learner_wait_s"]


def test_in_step_rollout_is_inside_the_wait(tmp_path):
    """At staleness 0 the rollout runs while the learner waits: the wait holds the whole rollout, and the
    tokens per second are the engine's (generated tokens over its own time)."""
    with Trainer(config(tmp_path, 0)) as tr:
        metrics = [tr.train_step() for _ in range(2)]
    for m in metrics:
        assert 0 < m["perf/rollout_s"] <= m["perf/learner_wait_s"]
        assert m["perf/tokens_per_s"] * m["perf/rollout_s"] >= m["rollout/trajectories"]  # >= 1 token each
