"""Which episodes the trainer plays: each step's tasks drawn from the env mixture, and the fixed evaluation tasks.

`draw_tasks` is a function of (seed, step) only, so a resumed run plays the
same tasks as an uninterrupted one. `eval_specs` are reset seeds
0..eval_tasks-1 with the envs in turn; `reward_summary` gives their mean reward
per trajectory with a 95% confidence interval (normal approximation) and the
failed and truncated trajectories counted.
"""

from __future__ import annotations

import functools
import math
import random
from typing import Any

import numpy as np

from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutResult
from palaestra.shared.rollout.env import ENVS, TextEnv


def make_env(name: str, kwargs: dict[str, Any]) -> TextEnv:
    """Build a registered env (module-level, so it pickles to Ray workers)."""
    return ENVS.get(name)(**kwargs)


def draw_tasks(cfg: TrainConfig, step: int) -> list[EpisodeSpec]:
    """This step's tasks: env by mixture weight, reset seed; a function of (seed, step) only."""
    rng = random.Random(cfg.seed * 1_000_003 + step)
    weights = [e.weight for e in cfg.envs]
    specs = []
    for i in range(cfg.tasks_per_step):
        env = rng.choices(cfg.envs, weights=weights)[0]
        seed = rng.randrange(cfg.task_seeds) if cfg.task_seeds else rng.randrange(2**31)
        specs.append(EpisodeSpec(functools.partial(make_env, env.name, dict(env.kwargs)), seed, f"{step}-{i}"))
    return specs


def eval_specs(cfg: TrainConfig) -> list[EpisodeSpec]:
    """The fixed evaluation tasks: reset seeds 0..eval_tasks-1, the envs of the mixture in turn."""
    return [
        EpisodeSpec(functools.partial(make_env, env.name, dict(env.kwargs)), i, f"eval-{i}")
        for i in range(cfg.eval_tasks)
        for env in [cfg.envs[i % len(cfg.envs)]]
    ]


def reward_summary(result: RolloutResult) -> dict[str, float]:
    """Mean reward per trajectory that did not fail, the half-width of its 95% interval, and the counts:
    ``trajectories`` (in the mean), ``failed`` (the env or the chat template raised: not in the mean),
    ``truncated`` (cut by a limit: in the mean with the reward it earned before the cut) and
    ``truncated_<limit>`` per limit (context, max_tokens, max_turns), so a cut is never read as a plain loss."""
    kept = [t for t in result.trajectories if not t.failed]
    rewards = np.array([t.total_reward for t in kept])
    mean = float(rewards.mean()) if len(rewards) else math.nan
    ci = float(1.96 * rewards.std(ddof=1) / math.sqrt(len(rewards))) if len(rewards) > 1 else math.nan
    out = {"reward_mean": mean, "reward_ci95": ci, "trajectories": len(rewards)}
    out["failed"] = len(result.trajectories) - len(kept)
    out["truncated"] = sum(t.truncated for t in kept)
    for limit in TRUNCATION_LIMITS:
        out[f"truncated_{limit}"] = sum(t.truncated and t.limit == limit for t in kept)
    return out


TRUNCATION_LIMITS = ("context", "max_tokens", "max_turns")
"""The engine's limits (`Trajectory.limit`); an env may also end an episode as truncated (no limit named)."""
