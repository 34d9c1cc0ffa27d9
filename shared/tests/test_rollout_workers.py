"""Ray rollout workers: same trajectories as in-process, weight sync, a killed worker is replaced and redone."""

import functools

import pytest
import torch

from palaestra.shared.llm import LLMConfig, make_client
from palaestra.shared.rl.episodes import make_env
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig
from palaestra.shared.rollout.workers import LocalRollouts, RayRollouts

pytestmark = pytest.mark.slow  # starts Ray actors with model replicas

LLM = LLMConfig(model="tiny", device="cpu")
CFG = RolloutConfig(group_size=2, max_tokens_per_turn=6)


def specs(n):
    return [EpisodeSpec(functools.partial(make_env, "task", {}), seed=i, group_id=str(i)) for i in range(n)]


def tokens(result):
    return [(t.group_id, t.turns[0].response_ids) for t in result.trajectories]


@pytest.fixture(scope="module")
def pool(ray_local):
    rollouts = RayRollouts(LLM, CFG, num_workers=1, num_cpus=0.5)
    yield rollouts
    rollouts.close()


def test_worker_matches_in_process_and_takes_new_weights(pool):
    local_client = make_client(LLM)
    local = LocalRollouts(local_client, CFG)
    # one worker runs shard 0 with seed*1009: the same episodes as in-process with that seed
    assert tokens(pool.run(specs(3), seed=2)) == tokens(local.run(specs(3), seed=2 * 1009))
    # new weights: perturb the learner's copy, push them, and the worker generates what the learner would
    with torch.no_grad():
        for p in local_client.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    before = tokens(pool.run(specs(3), seed=2))
    pool.sync(local_client.model.state_dict())
    after = tokens(pool.run(specs(3), seed=2))
    assert after != before
    assert after == tokens(local.run(specs(3), seed=2 * 1009))


def test_killed_worker_is_replaced_and_its_share_redone(pool):
    import ray

    expected = tokens(pool.run(specs(4), seed=5))
    old_pid = ray.get(pool.workers[0].pid.remote())
    ray.kill(pool.workers[0])
    result = pool.run(specs(4), seed=5)
    assert result.stats["worker_restarts"] == 1
    assert tokens(result) == expected  # same weights (re-sent on restart), same seeds: same rollout
    assert ray.get(pool.workers[0].pid.remote()) != old_pid
