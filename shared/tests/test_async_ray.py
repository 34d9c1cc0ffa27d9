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


def test_a_pinned_rollout_reruns_with_its_own_version_after_a_kill(ray_local):
    """``version_schedule: fixed`` on Ray: a rollout submitted at version 0 samples with version 0 throughout,
    though version 1 arrives while it runs and its worker dies: the tokens are those of version 0's weights."""
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pool = RayRollouts(LLM, CFG, num_workers=2, num_cpus=0.5, pin_versions=True)
    try:
        client = make_client(LLM)
        with torch.no_grad():
            for p in client.model.parameters():
                p.add_(0.3 * torch.randn_like(p))
        pool.sync(client.model.state_dict(), 0)
        handle = pool.submit(specs(1), seed=1)
        time.sleep(0.8)
        newer = {k: v + 0.3 * torch.randn_like(v) for k, v in client.model.state_dict().items()}
        pool.sync(newer, 1)  # kept for the next rollouts; the running one keeps version 0
        ray.kill(pool.workers[0])
        result = pool.collect(handle)
        after = pool.run(specs(2, n=2), seed=2)  # a rollout submitted now samples with version 1
    finally:
        pool.close()
    assert result.stats["worker_restarts"] == 1
    assert {v for t in result.trajectories for turn in t.turns for v in turn.response_versions} == {0}
    assert {v for t in after.trajectories for turn in t.turns for v in turn.response_versions} == {1}
    # shard i of 2 holds episodes 2i, 2i+1 and seed 1 * 1009 + i: replayed here with version 0's weights
    local = LocalRollouts(client, CFG)
    replay = [t for i in range(2) for t in local.run(specs(1)[2 * i : 2 * i + 2], seed=1009 + i).trajectories]
    assert [[turn.response_ids for turn in t.turns] for t in result.trajectories] == [
        [turn.response_ids for turn in t.turns] for t in replay
    ]


@pytest.mark.parametrize("schedule", ["newest", "fixed"])
def test_trainer_one_step_ahead_on_two_ray_workers(tmp_path, ray_local, schedule):
    from palaestra.shared.config import TrackingConfig
    from palaestra.shared.rl.config import EnvSpec, TrainConfig, WorkersConfig
    from palaestra.shared.rl.trainer import Trainer
    from palaestra.shared.testing import TEST_CLUSTER

    rollout = RolloutConfig(group_size=2, max_tokens_per_turn=4, max_staleness=1, version_schedule=schedule)
    cfg = TrainConfig(
        job="rl.train",
        envs=[EnvSpec("task", {"source": "next_number"})],
        output_dir=str(tmp_path / "out"),
        tracking=TrackingConfig(enabled=False),
        rollout=rollout,
        workers=WorkersConfig(num_workers=2, num_cpus=0.5),
        cluster=TEST_CLUSTER,
        steps=3,
        tasks_per_step=2,
    )
    with Trainer(cfg) as tr:
        history = [tr.train_step() for _ in range(3)]
    for step, m in enumerate(history):
        tokens = m["rollout/response_tokens_mean"] * m["rollout/trajectories"]
        assert m["async/tokens_lag_0"] + m["async/tokens_lag_1"] == tokens and m["async/staleness_max"] <= 1
        if schedule == "fixed":  # step s samples with version max(0, s - 1) only
            assert m[f"async/tokens_lag_{min(step, 1)}"] == tokens
    assert history[1]["async/tokens_lag_1"] > 0  # step 1 started before step 0's update


def test_sharded_learner_one_step_ahead(tmp_path, ray_local):
    """learner.world_size 2 (gloo, FSDP) with in-process rollouts one step ahead: the trainer's copy of the
    weights (what the background rollouts are synced from) stays the ranks' after each update."""
    from palaestra.shared.config import TrackingConfig
    from palaestra.shared.rl.config import EnvSpec, LearnerConfig, TrainConfig
    from palaestra.shared.rl.trainer import Trainer
    from palaestra.shared.testing import TEST_CLUSTER

    cfg = TrainConfig(
        job="rl.train",
        envs=[EnvSpec("task", {"source": "next_number"})],
        output_dir=str(tmp_path / "out"),
        tracking=TrackingConfig(enabled=False),
        rollout=RolloutConfig(group_size=2, max_tokens_per_turn=4, max_staleness=1, version_schedule="fixed"),
        learner=LearnerConfig(world_size=2, strategy="fsdp"),
        cluster=TEST_CLUSTER,
        steps=2,
        tasks_per_step=2,
    )
    with Trainer(cfg) as tr:
        history = [tr.train_step() for _ in range(2)]
        gathered, own = tr.policies[0].learner.state_dict(), tr.policies[0].model.state_dict()
        assert all(torch.equal(own[k], v) for k, v in gathered.items())
    m = history[1]
    assert m["async/tokens_lag_1"] == m["rollout/response_tokens_mean"] * m["rollout/trajectories"]


def test_fixed_schedule_on_ray_resumes_bit_exact(tmp_path, ray_local):
    """One Ray worker, k = 1, fixed: 3 steps straight vs 1 step, a checkpoint holding step 1's rollout (collected
    from the worker), a new trainer resuming, 2 more steps: the same metrics and weights, bit for bit."""
    from palaestra.shared.config import TrackingConfig
    from palaestra.shared.rl.config import EnvSpec, TrainConfig, WorkersConfig
    from palaestra.shared.rl.trainer import Trainer
    from palaestra.shared.testing import TEST_CLUSTER

    def cfg(name: str, resume: bool = False) -> TrainConfig:
        return TrainConfig(
            job="rl.train",
            envs=[EnvSpec("task", {"source": "next_number"})],
            output_dir=str(tmp_path / name),
            tracking=TrackingConfig(enabled=False),
            rollout=RolloutConfig(group_size=2, max_tokens_per_turn=4, max_staleness=1, version_schedule="fixed"),
            workers=WorkersConfig(num_workers=1, num_cpus=0.5),
            cluster=TEST_CLUSTER,
            steps=3,
            tasks_per_step=2,
            resume=resume,
        )

    def comparable(metrics):
        return {k: v for k, v in metrics.items() if not k.startswith("perf/")}

    with Trainer(cfg("straight")) as tr:
        straight = [comparable(tr.train_step()) for _ in range(3)]
        final = {k: v.clone() for k, v in tr.policies[0].model.state_dict().items()}
    with Trainer(cfg("cut")) as tr:
        first = [comparable(tr.train_step())]
        tr.save()
    with Trainer(cfg("cut", resume=True)) as tr:
        rest = [comparable(tr.train_step()) for _ in range(2)]
        after = tr.policies[0].model.state_dict()
    assert first + rest == straight
    assert all(torch.equal(after[k], v) for k, v in final.items())
