"""Ray rollout workers holding vLLM engines (``vllm`` marker: ``.venv-vllm`` under ``make test``).

The paper configs' path: `RayRollouts` with ``workers.llm.backend: vllm`` and the default
``workers.weight_sync: object_store``. After a learner step and `RayRollouts.sync`, the worker's greedy rollouts
equal those of the transformers backend with the same weights (issue 23, defect 1: the sync used to fail with
"cannot pickle memoryview objects"). Starts one more engine (about two minutes on 2 cores).
"""

import dataclasses
import functools

import pytest

from palaestra.shared.llm import LLMConfig
from palaestra.shared.rl.episodes import make_env
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig
from palaestra.shared.rollout.workers import LocalRollouts, RayRollouts
from palaestra.shared.testing import learner_step, tiny_learner

pytestmark = pytest.mark.vllm

GREEDY = RolloutConfig(group_size=1, max_tokens_per_turn=8, temperature=0.0)


def specs(n):
    return [EpisodeSpec(functools.partial(make_env, "task", {}), seed=i, group_id=str(i)) for i in range(n)]


def tokens(result):
    return [(t.group_id, [turn.response_ids for turn in t.turns]) for t in result.trajectories]


def test_a_learner_step_reaches_a_vllm_ray_worker(ray_local):
    pool = RayRollouts(LLMConfig(backend="vllm", model="tiny", dtype="float32"), GREEDY, num_workers=1, num_cpus=1)
    try:
        learner = tiny_learner()
        local = LocalRollouts(learner, GREEDY)
        # one worker runs shard 0 with seed * 1009: the same episodes as in-process with that seed
        before = tokens(pool.run(specs(6), seed=2))
        assert before == tokens(local.run(specs(6), seed=2 * 1009))
        learner_step(learner)
        expected = tokens(local.run(specs(6), seed=2 * 1009))
        assert expected != before
        pool.sync(learner.model.state_dict())
        assert tokens(pool.run(specs(6), seed=2)) == expected
        # evaluation inside training plays on these workers and weights with its own settings (issue 23, defect 3)
        evaluation = dataclasses.replace(GREEDY, response_prefix="<think>", max_tokens_per_turn=5)
        played = pool.run(specs(6), seed=2, cfg=evaluation)
        assert tokens(played) == tokens(local.run(specs(6), seed=2 * 1009, cfg=evaluation)) != expected
        prefix = learner.tokenizer.encode("<think>", add_special_tokens=False)
        assert all(t.turns[0].prompt_ids[-len(prefix) :] == prefix for t in played.trajectories)
    finally:
        pool.close()
