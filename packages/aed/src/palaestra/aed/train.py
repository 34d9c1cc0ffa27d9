"""Training and evaluating one adversarial policy (stable-baselines3) against one victim.

`AdversarySpec` is everything needed to build an `AdversaryEnv` in any process
(names and code strings, no live objects): the sandboxed reward and the
preference filter are built inside the process that steps the env.

- `train_adversary`: SB3 DQN (one adversary) or PPO (any number), vectorized
  over ``n_envs`` subprocesses when that pays (``n_envs > 1``); a callback
  counts victim collisions and remembers the step of the first one.
- `evaluate`: attack success rate (victim collisions per episode), the share
  of accidents the victim is responsible for, accident types, and the
  accident records; ``policy=None`` is the random adversary baseline.
- `record_gif`: renders headless (rgb_array) until an accident happens and
  writes a GIF with imageio.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from palaestra.shared.stats import wilson_interval


@dataclass
class AdversarySpec:
    scenario: str = "highway"
    accident_type: str = "rear_end"
    victim: str = "idm"
    victim_checkpoint: str | None = None
    num_adversaries: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)
    max_steps: int | None = None
    reward_code: str | None = None
    """LLM-written reward code (run sandboxed); None: the expert reward of the type."""
    preference_model: dict | None = None
    """A serialized `PreferenceModel` whose verdict filters accidents (ineffective ones earn nothing)."""
    effective_bonus: float = 0.0
    """Extra reward for an accident the preference model scores effective."""
    ineffective_penalty: float = 0.0
    """Penalty for an accident the preference model scores ineffective (0: it just earns nothing)."""
    responsibility_shaping: float = 0.0
    """Weight of the dense preference reward (the model's verdict on the contact that would happen now)."""


def make_env(spec: AdversarySpec, render: bool = False):
    from palaestra.aed.env import AdversaryEnv

    reward_fn = None
    if spec.reward_code:
        from palaestra.aed.sandbox import SandboxedReward

        reward_fn = SandboxedReward(spec.reward_code)
    accident_filter = score = None
    if spec.preference_model:
        from palaestra.aed.preference import PreferenceModel

        preference = PreferenceModel.from_dict(spec.preference_model)
        accident_filter, score = preference.is_effective, preference.margin
    return AdversaryEnv(
        spec.scenario,
        spec.accident_type,
        victim=spec.victim,
        victim_checkpoint=spec.victim_checkpoint,
        num_adversaries=spec.num_adversaries,
        reward_fn=reward_fn,
        accident_filter=accident_filter,
        effective_bonus=spec.effective_bonus,
        ineffective_penalty=spec.ineffective_penalty,
        responsibility_score=score,
        responsibility_shaping=spec.responsibility_shaping,
        overrides=spec.overrides,
        max_steps=spec.max_steps,
        render_mode="rgb_array" if render else None,
    )


@dataclass
class TrainSettings:
    algo: str = "dqn"
    """dqn (one adversary) | ppo."""
    timesteps: int = 2000
    """Environment steps of training (per accident type)."""
    n_envs: int = 1
    """Environments stepped in parallel subprocesses (1: in-process)."""
    learning_rate: float = 5e-4
    gamma: float = 0.9
    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    learning_starts: int = 200
    """DQN: steps of random exploration before learning."""


def _vec_env(spec: AdversarySpec, n_envs: int, seed: int):
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    cls = SubprocVecEnv if n_envs > 1 else DummyVecEnv
    return make_vec_env(lambda: make_env(spec), n_envs=n_envs, seed=seed, vec_env_cls=cls)


def build_model(spec: AdversarySpec, settings: TrainSettings, seed: int):
    from stable_baselines3 import DQN, PPO

    if settings.algo not in ("dqn", "ppo"):
        raise ValueError(f"algo must be 'dqn' or 'ppo', got {settings.algo!r}")
    if settings.algo == "dqn" and spec.num_adversaries > 1:
        raise ValueError("several adversaries act jointly (MultiDiscrete): use algo=ppo")
    env = _vec_env(spec, settings.n_envs, seed)
    kwargs = dict(learning_rate=settings.learning_rate, gamma=settings.gamma, seed=seed, device="cpu", verbose=0)
    if settings.algo == "dqn":
        return DQN(
            "MlpPolicy",
            env,
            policy_kwargs={"net_arch": settings.net_arch},
            buffer_size=20_000,
            learning_starts=settings.learning_starts,
            batch_size=32,
            train_freq=1,
            target_update_interval=250,
            exploration_fraction=0.4,
            exploration_final_eps=0.05,
            **kwargs,
        )
    n_steps = max(64, 256 // settings.n_envs)
    return PPO(
        "MlpPolicy",
        env,
        policy_kwargs={"net_arch": settings.net_arch},
        n_steps=n_steps,
        batch_size=64,
        n_epochs=5,
        **kwargs,
    )


def restart_exploration(model, initial_eps: float, fraction: float = 0.4) -> None:
    """Fine-tuning under a new reward: a fresh DQN exploration schedule and an empty replay buffer.

    The buffer's transitions carry the old reward (e.g. +10 for ramming the victim), which would keep teaching
    the old behaviour; SB3 otherwise resumes the schedule where it ended (at its final epsilon)."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.utils import LinearSchedule

    if isinstance(model, DQN):
        model.replay_buffer.reset()
        model.exploration_initial_eps = initial_eps
        model.exploration_schedule = LinearSchedule(initial_eps, model.exploration_final_eps, fraction)


def train_adversary(model, timesteps: int, log=None, log_every: int = 500, restart: bool = False) -> dict[str, Any]:
    """Continue training `model` for `timesteps` (``restart``: schedules start over); return training statistics."""
    from stable_baselines3.common.callbacks import BaseCallback

    class AttackStats(BaseCallback):
        def __init__(self):
            super().__init__()
            self.episodes = self.accidents = self.responsible = 0
            self.first_success: int | None = None
            self.reward_errors: set[str] = set()
            self.reward_dropped_at: int | None = None
            self.types: Counter = Counter()
            self.accident_log: list[dict] = []
            self.accident_slots: list[tuple[int, int] | None] = []

        def _on_step(self) -> bool:
            # off-policy (DQN): the transition of this step is stored at the buffer's current position right after
            # this callback, so each accident's slot is known (for relabelling its reward under a new reward model)
            buffer = getattr(self.model, "replay_buffer", None)
            for env_idx, info in enumerate(self.locals["infos"]):
                if "reward_error" in info:
                    self.reward_errors.add(info["reward_error"])
                    if self.reward_dropped_at is None:
                        self.reward_dropped_at = self.num_timesteps
                if "accident" in info:
                    self.accidents += 1
                    if len(self.accident_log) < 2000:
                        self.accident_log.append(info["accident"])
                        self.accident_slots.append((buffer.pos, env_idx) if buffer is not None else None)
                    self.types[info["accident"]["accident_type"]] += 1
                    self.responsible += bool(info["accident"]["victim_responsible"])
                    if self.first_success is None:
                        self.first_success = self.num_timesteps
                if "attack" in info:
                    self.episodes += 1
            if log is not None and self.num_timesteps % log_every < self.training_env.num_envs:
                log(
                    {
                        "train/episodes": self.episodes,
                        "train/accidents": self.accidents,
                        "train/accidents_per_episode": self.accidents / max(1, self.episodes),
                    },
                    self.num_timesteps,
                )
            return True

    stats = AttackStats()
    model.learn(total_timesteps=timesteps, callback=stats, reset_num_timesteps=restart)
    return {
        "episodes": stats.episodes,
        "accidents": stats.accidents,
        "responsible": stats.responsible,
        "steps_to_first_success": stats.first_success,
        "reward_errors": sorted(stats.reward_errors),
        "reward_dropped_at": stats.reward_dropped_at,
        "types": dict(stats.types),
        "accident_log": stats.accident_log,
        "accident_slots": stats.accident_slots,
    }


class IdlePolicy:
    """Passive adversaries: every one keeps its lane and speed (IDLE), for the victim's own accident rate."""

    def __init__(self, num_adversaries: int = 1):
        from palaestra.aed.scenarios import ACTIONS

        idle = ACTIONS.index("IDLE")
        self.action = idle if num_adversaries == 1 else np.full(num_adversaries, idle)

    def predict(self, obs, deterministic: bool = True):
        return self.action, None


def evaluate(policy, spec: AdversarySpec, episodes: int, seed: int) -> dict[str, Any]:
    """Run `episodes` attacks (policy None: uniformly random adversary actions)."""
    env = make_env(spec)
    env.action_space.seed(seed)
    accidents: list[dict] = []
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done, total = False, 0.0
        while not done:
            if policy is None:
                action = env.action_space.sample()
            else:
                action, _ = policy.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, info = env.step(action)
            total += reward
            done = terminated or truncated
        returns.append(total)
        summary = info["attack"]
        if summary["victim_collision"]:
            accidents.append(summary["accident"])
    env.close()
    return summarize(accidents, episodes, returns)


def summarize(accidents: list[dict], episodes: int, returns: list[float] | None = None) -> dict[str, Any]:
    """ASR (accidents per episode), responsible_rate (share of accidents the victim is responsible for), and
    effective_asr (responsible accidents per episode), each with its 95% Wilson interval."""
    types = Counter(a["accident_type"] for a in accidents)
    responsible = sum(bool(a["victim_responsible"]) for a in accidents)
    return {
        "episodes": episodes,
        "asr": len(accidents) / max(1, episodes),
        "asr_ci": wilson_interval(len(accidents), episodes),
        "responsible_rate": responsible / len(accidents) if accidents else 0.0,
        "responsible_rate_ci": wilson_interval(responsible, len(accidents)),
        "effective_asr": responsible / max(1, episodes),
        "effective_asr_ci": wilson_interval(responsible, episodes),
        "types": dict(types),
        "mean_return": float(np.mean(returns)) if returns else 0.0,
        "accidents": accidents,
    }


def type_entropy(counts: dict[str, int]) -> float:
    """Shannon entropy (nats) of the accident-type distribution."""
    total = sum(counts.values())
    if not total:
        return 0.0
    p = np.asarray([c / total for c in counts.values() if c])
    return float(-(p * np.log(p)).sum())


def record_gif(
    policy, spec: AdversarySpec, path: str | Path, seed: int, max_episodes: int = 5, fps: int = 8
) -> dict | None:
    """Render attacks headless until one ends in a victim collision; write that episode as a GIF."""
    import imageio.v2 as imageio

    env = make_env(spec, render=True)
    chosen, summary = None, None
    for ep in range(max_episodes):
        obs, _ = env.reset(seed=seed + ep)
        frames, done = [env.render()], False
        env.on_frame = frames.append
        while not done:
            action = env.action_space.sample() if policy is None else policy.predict(obs, deterministic=True)[0]
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        chosen, summary = frames, info["attack"]
        if summary["victim_collision"]:
            break
    env.close()
    imageio.mimsave(
        str(path), [np.asarray(f) for f in chosen] + [np.asarray(chosen[-1])] * fps, duration=1.0 / fps, loop=0
    )
    return summary
