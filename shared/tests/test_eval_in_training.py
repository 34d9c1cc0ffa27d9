"""Evaluation inside training (issue 23, defect 3): it plays on the training rollouts (the same workers, backend
and synced weights) with the training context length, sampling settings and response prefix, unless the config's
``eval`` section sets them; failed and truncated episodes are counted, not read as losses."""

import dataclasses
import functools

import pytest
import torch

from palaestra.shared.config import TrackingConfig, resolve, to_dict
from palaestra.shared.rewards import REWARDS
from palaestra.shared.rl.config import EnvSpec, TrainConfig
from palaestra.shared.rl.episodes import make_env, reward_summary
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutResult
from palaestra.shared.rollout.trajectory import Trajectory
from palaestra.shared.rollout.workers import LocalRollouts

# the paper configs' training sampling (MARS: T 0.6, top_p 0.99, top_k 100, "<think>\n", a 32,768-token sequence)
PAPER_ROLLOUT = {
    "group_size": 8,
    "max_turns": 40,
    "max_tokens_per_turn": 4096,
    "max_context_tokens": 32768,
    "temperature": 0.6,
    "top_p": 0.99,
    "top_k": 100,
    "stop": ["</answer>"],
    "response_prefix": "<think>\n",
}


@REWARDS.register("test_eval_length")
def _length(sample, completion, **info) -> float:
    return len(completion) / 10


def test_unset_eval_fields_are_the_rollouts_and_the_logged_config_holds_them():
    cfg = resolve(TrainConfig, {"job": "rl.train", "rollout": PAPER_ROLLOUT, "eval": {"group_size": 1}})
    expected = {**PAPER_ROLLOUT, "group_size": 1}  # the one field the eval section sets
    assert {k: getattr(cfg.eval, k) for k in expected} == expected
    logged = to_dict(cfg)["eval"]  # what MLflow's config.yaml holds is what evaluations run with
    assert {k: logged[k] for k in expected} == expected
    run_cfg = cfg.eval.rollout_config(cfg.rollout)
    assert isinstance(run_cfg, RolloutConfig)
    assert {k: getattr(run_cfg, k) for k in expected} == expected
    assert run_cfg.max_failed_share == cfg.rollout.max_failed_share
    # an override on the command line reaches the eval section, the rest still follows the rollout
    cfg = resolve(TrainConfig, {"job": "rl.train", "rollout": PAPER_ROLLOUT}, ["eval.temperature=0.0"])
    assert cfg.eval.temperature == 0.0 and cfg.eval.max_context_tokens == 32768 and cfg.eval.top_k == 100


class RecordingRollouts:
    """The trainer's rollouts, recording the settings each run was given."""

    def __init__(self, inner):
        self.inner, self.runs = inner, []

    def run(self, specs, seed, cfg=None):
        result = self.inner.run(specs, seed, cfg)
        self.runs.append((cfg, result))
        return result

    def sync(self, state_dict, version=None):
        self.inner.sync(state_dict, version)

    def close(self):
        self.inner.close()


def test_evaluate_plays_on_the_training_rollouts_with_the_training_settings(tmp_path, monkeypatch):
    torch.manual_seed(0)
    rollout = RolloutConfig(
        group_size=2,
        max_turns=3,
        max_tokens_per_turn=4,
        max_context_tokens=300,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        response_prefix="<think>",
    )
    cfg = TrainConfig(
        job="rl.train",
        envs=[EnvSpec("task", {"reward": "test_eval_length"})],
        output_dir=str(tmp_path),
        tracking=TrackingConfig(enabled=False),
        rollout=rollout,
        steps=0,
        eval_tasks=2,
    )
    with Trainer(cfg) as trainer:
        trainer.prepare()
        recording = RecordingRollouts(trainer.rollouts)
        trainer.rollouts = recording
        params, prompts = [], []
        generate = trainer.client.generate

        def recording_generate(batch, sampling):
            params.append(sampling)
            prompts.extend(batch)
            return generate(batch, sampling)

        monkeypatch.setattr(trainer.client, "generate", recording_generate)
        metrics = trainer.evaluate()
    [(run_cfg, result)] = recording.runs
    # the settings the rollouts were given are the training rollout's, field by field
    assert run_cfg is not None
    for name in ("max_turns", "max_tokens_per_turn", "max_context_tokens", "temperature", "top_p", "top_k"):
        assert getattr(run_cfg, name) == getattr(rollout, name), name
    assert run_cfg.response_prefix == "<think>" and run_cfg.group_size == 2
    # ... and what the model was asked with
    assert params and all((p.temperature, p.top_p, p.top_k, p.max_tokens) == (0.7, 0.9, 5, 4) for p in params)
    prefix = trainer.policies[0].tokenizer.encode("<think>", add_special_tokens=False)
    assert prompts and all(p[-len(prefix) :] == prefix for p in prompts)
    # every trajectory counted, the truncated ones by name (4-token answers of a random model run out of tokens)
    trajs = result.trajectories
    assert metrics["trajectories"] == len(trajs) == 2 * 2
    truncated = sum(t.truncated for t in trajs)
    assert truncated > 0 and metrics["truncated"] == truncated
    assert metrics["truncated_max_tokens"] == sum(t.limit == "max_tokens" for t in trajs)
    assert metrics["failed"] == 0


def test_an_eval_override_reaches_the_engine_for_that_run_only(tiny_llm):
    train = RolloutConfig(group_size=1, max_tokens_per_turn=4, max_context_tokens=4096, temperature=1.0)
    rollouts = LocalRollouts(tiny_llm, train)
    specs = [EpisodeSpec(functools.partial(make_env, "task", {}), i, f"eval-{i}") for i in range(3)]
    first = rollouts.run(specs, seed=1).trajectories[0].turns[0]
    room = len(first.prompt_ids) + 1  # one generated token fits, then the context is full
    evaluation = dataclasses.replace(train, max_context_tokens=room, temperature=0.0)
    result = rollouts.run(specs, seed=1, cfg=evaluation)
    assert all(t.limit == "context" and t.num_response_tokens == 1 for t in result.trajectories)
    assert reward_summary(result)["truncated_context"] == 3
    assert rollouts.engine.cfg is train  # the training settings are untouched
    assert all(t.limit != "context" for t in rollouts.run(specs, seed=1).trajectories)


def test_reward_summary_counts_failed_and_truncated_trajectories():
    def traj(reward, failed=False, limit=None):
        t = Trajectory(env_type="text", agent="a", group_id="g", extra_reward=reward)
        t.failed, t.truncated, t.limit = failed, limit is not None, limit
        return t

    trajs = [traj(1.0), traj(0.0, limit="context"), traj(0.5, limit="max_turns"), traj(9.0, failed=True)]
    out = reward_summary(RolloutResult(trajs, {}))
    kept = [1.0, 0.0, 0.5]  # the failed one is out of the mean, the truncated ones are in it with what they earned
    mean = sum(kept) / 3
    sd = (sum((r - mean) ** 2 for r in kept) / 2) ** 0.5
    assert out["reward_mean"] == pytest.approx(mean)
    assert out["reward_ci95"] == pytest.approx(1.96 * sd / 3**0.5)
    assert (out["trajectories"], out["failed"], out["truncated"]) == (3, 1, 2)
    assert (out["truncated_context"], out["truncated_max_turns"], out["truncated_max_tokens"]) == (1, 1, 0)


@pytest.mark.slow
def test_an_evaluation_on_ray_workers_plays_with_its_settings_also_when_a_shard_is_redone(ray_local, tiny_llm):
    import ray

    from palaestra.shared.llm import LLMConfig
    from palaestra.shared.rollout.workers import RayRollouts

    train = RolloutConfig(group_size=2, max_tokens_per_turn=6, temperature=1.0)
    evaluation = dataclasses.replace(train, group_size=1, temperature=0.0, response_prefix="<think>")
    specs = [EpisodeSpec(functools.partial(make_env, "task", {}), i, f"eval-{i}") for i in range(3)]

    def played(result):
        return [(t.group_id, t.turns[0].prompt_ids, t.turns[0].response_ids) for t in result.trajectories]

    # the worker (shard 0, seed * 1009) plays what this process plays with the evaluation's settings
    expected = played(LocalRollouts(tiny_llm, train).run(specs, 4 * 1009, evaluation))
    prefix = tiny_llm.tokenizer.encode("<think>", add_special_tokens=False)
    assert len(expected) == 3 and all(prompt[-len(prefix) :] == prefix for _, prompt, _ in expected)
    pool = RayRollouts(LLMConfig(model="tiny", device="cpu"), train, num_workers=1, num_cpus=0.5)
    try:
        assert played(pool.run(specs, 4, evaluation)) == expected
        handle = pool.submit(specs, 4, evaluation)
        ray.kill(pool.workers[0])  # the shard is redone on a fresh worker, with the same settings
        result = pool.collect(handle)
        assert result.stats["worker_restarts"] == 1 and played(result) == expected
        assert len(pool.run(specs, 4).trajectories) == 6  # the workers' own settings: groups of 2
    finally:
        pool.close()
