"""Bounded-staleness rollouts on Ray workers: two steps in flight, new weights arriving mid-episode, a worker
killed mid-episode; every episode comes back exactly once, its tokens tagged with the versions that sampled it."""

import functools
import sys
import time
from collections import Counter

import pytest
import torch

from palaestra.shared.llm import LLMConfig, make_client
from palaestra.shared.rl.episodes import make_env
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig
from palaestra.shared.rollout.env import Step, TextEnv
from palaestra.shared.rollout.workers import LocalRollouts, RayRollouts

pytestmark = pytest.mark.slow  # Ray actors with model replicas

LLM = LLMConfig(model="tiny", device="cpu")
CFG = RolloutConfig(group_size=2, max_tokens_per_turn=3, max_turns=6)


class SlowTalk(TextEnv):
    """Four turns of one agent, each step taking 0.3 s (time for weights and a kill to land mid-episode)."""

    def reset(self, seed=None):
        self.turn = 0
        return {}

    def observe(self, agent):
        return [{"role": "user", "content": f"turn {self.turn}"}]

    def step(self, action):
        time.sleep(0.3)
        self.turn += 1
        return Step({"agent": 1.0}, terminated=self.turn == 4)


def tokens(result):
    return [t.turns[0].response_ids for t in result.trajectories]


def specs(step: int, n: int = 4) -> list[EpisodeSpec]:
    return [EpisodeSpec(SlowTalk, seed=i, group_id=f"{step}-{i}") for i in range(n)]


def test_two_steps_in_flight_survive_an_update_and_a_killed_worker(ray_local):
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the env class travels with the specs
    pool = RayRollouts(LLM, CFG, num_workers=2, num_cpus=0.5, concurrent=True)
    try:
        client = make_client(LLM)
        with torch.no_grad():
            for p in client.model.parameters():
                p.add_(0.3 * torch.randn_like(p))
        pool.sync(client.model.state_dict(), 0)
        # a rollout started right after a sync samples with those weights (the offer is not overtaken)
        task = [EpisodeSpec(functools.partial(make_env, "task", {}), seed=0, group_id="t")]
        expected = LocalRollouts(client, CFG).run(task, seed=3 * 1009)  # shard 0's seed
        assert tokens(pool.run(task, seed=3)) == tokens(expected)
        first, second = pool.submit(specs(1), seed=1), pool.submit(specs(2), seed=2)  # steps 1 and 2 in flight
        time.sleep(1.5)  # episodes are past their first turns
        with torch.no_grad():
            for p in client.model.parameters():
                p.add_(0.3 * torch.randn_like(p))
        pool.sync(client.model.state_dict(), 1)  # the learner's update lands mid-episode
        time.sleep(0.5)
        ray.kill(pool.workers[0])  # a worker dies mid-episode
        results = [pool.collect(first), pool.collect(second)]
    finally:
        pool.close()
    for step, result in zip((1, 2), results):
        groups = Counter(t.group_id for t in result.trajectories)
        assert groups == {f"{step}-{i}": 2 for i in range(4)}  # every episode exactly once (group of 2)
        assert all(len(t.turns) == 4 for t in result.trajectories)  # none discarded as stale
    trajs = [t for r in results for t in r.trajectories]
    assert all(len(set(turn.response_versions)) == 1 for t in trajs for turn in t.turns)  # one per model call
    versions = [[turn.response_versions[0] for turn in t.turns] for t in trajs]
    assert all(per_turn == sorted(per_turn) for per_turn in versions)  # never back in time
    # the surviving worker's episodes spanned the update: version 0 first, then 1, in one episode
    assert any(per_turn[0] == 0 and per_turn[-1] == 1 for per_turn in versions)
    assert sum(r.stats["worker_restarts"] for r in results) >= 1
