"""Rollouts ahead of the learner on a Ray worker holding a vLLM engine (``vllm`` marker; run in ``.venv-vllm``).

``version_schedule: newest`` (a concurrent actor: the weights offered while a multi-turn episode runs load before
its next generate call) and ``fixed`` (each rollout carries its version's weights, loaded before it starts).
After each, a greedy rollout equals the transformers backend's with the same weights. One vLLM engine per case
(about two minutes each on 2 cores): not in ``make test``'s vLLM stage.
"""

import copy
import functools
import sys
import time

import pytest

from palaestra.shared.llm import LLMConfig
from palaestra.shared.rl.episodes import make_env
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig
from palaestra.shared.rollout.env import Step, TextEnv
from palaestra.shared.rollout.workers import LocalRollouts, RayRollouts
from palaestra.shared.testing import learner_step, tiny_learner

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GREEDY = RolloutConfig(group_size=1, max_tokens_per_turn=6, max_turns=6, temperature=0.0)


class SlowTalk(TextEnv):
    """Four turns, each step taking 0.5 s: time for new weights to arrive mid-episode. Prompts differ per seed
    (the engine sends identical prompts as one with n completions, which vLLM refuses when greedy)."""

    def reset(self, seed=None):
        self.turn, self.seed = 0, seed
        return {}

    def observe(self, agent):
        return [{"role": "user", "content": f"episode {self.seed}, turn {self.turn}"}]

    def step(self, action):
        time.sleep(0.5)
        self.turn += 1
        return Step({"agent": 1.0}, terminated=self.turn == 4)


def tasks(n):
    return [EpisodeSpec(functools.partial(make_env, "task", {}), seed=i, group_id=str(i)) for i in range(n)]


def tokens(result):
    return [(t.group_id, [turn.response_ids for turn in t.turns]) for t in result.trajectories]


def versions(result):
    return [[turn.response_versions[0] for turn in t.turns] for t in result.trajectories]


@pytest.mark.parametrize("schedule", ["newest", "fixed"])
def test_vllm_worker_ahead_of_the_learner(ray_local, schedule):
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    llm = LLMConfig(backend="vllm", model="tiny", dtype="float32")
    fixed = schedule == "fixed"
    pool = RayRollouts(llm, GREEDY, num_workers=1, num_cpus=1, concurrent=not fixed, pin_versions=fixed)
    try:
        learner = tiny_learner()
        local = LocalRollouts(learner, GREEDY)
        pool.sync(learner.model.state_dict(), 0)
        old = copy.deepcopy(learner.model.state_dict())
        talk = [EpisodeSpec(SlowTalk, seed=i, group_id=f"talk-{i}") for i in range(2)]
        running = pool.submit(talk, seed=1)  # a multi-turn rollout in flight
        time.sleep(1.2)
        learner_step(learner)
        pool.sync(learner.model.state_dict(), 1)  # the update lands while it runs
        played = pool.collect(running)
        assert all(v == sorted(v) and len(v) == 4 for v in versions(played))
        if fixed:  # the whole rollout sampled with version 0: greedy, the tokens of version 0's weights
            assert all(set(v) == {0} for v in versions(played))
            new = copy.deepcopy(learner.model.state_dict())
            learner.model.load_state_dict(old)
            assert tokens(played) == tokens(local.run(talk, seed=1009))
            learner.model.load_state_dict(new)
        else:  # the episodes continued with version 1's weights
            assert any(v[0] == 0 and v[-1] == 1 for v in versions(played))
        after = pool.run(tasks(4), seed=2)  # a rollout started after the sync: version 1, the learner's tokens
        assert {v for vs in versions(after) for v in vs} == {1}
        assert tokens(after) == tokens(local.run(tasks(4), seed=2 * 1009))
    finally:
        pool.close()
