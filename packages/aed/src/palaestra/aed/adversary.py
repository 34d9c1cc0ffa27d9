"""Training and evaluating one adversarial policy (stable-baselines3) against one victim.

`AdversarySpec` is everything needed to build an `AdversaryEnv` in any process
(names and code strings, no live objects): the sandboxed reward and the
preference filter are built inside the process that steps the env.

- `train_adversary`: SB3 DQN (one adversary) or PPO (any number), vectorized
  over ``n_envs`` subprocesses when that pays (``n_envs > 1``); a callback
  counts victim collisions and remembers the step of the first one.

Evaluation lives in `palaestra.aed.evaluation`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


@dataclass
class AdversarySpec:
    scenario: str = "highway"
    accident_type: str = "rear_end"
    victim: str = "idm"
    victim_checkpoint: str | None = None
    num_adversaries: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)
    max_steps: int | None = None
    placement: str = "nearest"
    """Which NPCs become adversaries: nearest (to the victim) | scenario (`scenarios.AdversaryPlacement`)."""
    reward_code: str | None = None
    """LLM-written reward code (run sandboxed); None: the expert reward of the type."""
    taxonomy: list[dict] | None = None
    """The scenario's accident types (`proposals.AccidentType` dicts, LLM-proposed with recognizer code);
    None: the fixed taxonomy (`attribution.classify`)."""
    preference_model: dict | None = None
    """A serialized `PreferenceModel` whose verdict filters accidents (ineffective ones earn nothing)."""
    effective_bonus: float = 0.0
    """Extra reward for an accident the preference model scores effective."""
    ineffective_penalty: float = 0.0
    """Penalty for an accident the preference model scores ineffective (0: it just earns nothing)."""
    responsibility_shaping: float = 0.0
    """Weight of the dense preference reward (the model's verdict on the contact that would happen now)."""


def make_env(spec: AdversarySpec, render: bool = False, reward_fn=None):
    """The `AdversaryEnv` of `spec`; ``reward_fn`` replaces the spec's reward (e.g. a replay needs none)."""
    from palaestra.aed.env import AdversaryEnv

    if reward_fn is None and spec.reward_code:
        from palaestra.aed.sandbox import SandboxedReward

        reward_fn = SandboxedReward(spec.reward_code)
    classifier = None
    if spec.taxonomy:
        from palaestra.aed.proposals import Taxonomy

        classifier = Taxonomy(spec.scenario, spec.taxonomy)
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
        classifier=classifier,
        accident_filter=accident_filter,
        effective_bonus=spec.effective_bonus,
        ineffective_penalty=spec.ineffective_penalty,
        responsibility_score=score,
        responsibility_shaping=spec.responsibility_shaping,
        overrides=spec.overrides,
        max_steps=spec.max_steps,
        render_mode="rgb_array" if render else None,
        placement=spec.placement,
    )


class RLAlgo(StrEnum):
    """The SB3 algorithm of a driving policy (adversary or victim)."""

    dqn = "dqn"
    ppo = "ppo"


@dataclass
class TrainSettings:
    algo: RLAlgo = RLAlgo.dqn
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


def adversary_vec_env(spec: AdversarySpec, n_envs: int, seed: int):
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
    env = adversary_vec_env(spec, settings.n_envs, seed)
    kwargs: dict[str, Any] = dict(
        learning_rate=settings.learning_rate, gamma=settings.gamma, seed=seed, device="cpu", verbose=0
    )
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
        assert model.replay_buffer is not None  # built with the model
        model.replay_buffer.reset()
        model.exploration_initial_eps = initial_eps
        model.exploration_schedule = LinearSchedule(initial_eps, model.exploration_final_eps, fraction)


def train_adversary(
    model, timesteps: int, log=None, log_every: int = 500, restart: bool = False, target: str | None = None
) -> dict[str, Any]:
    """Continue training `model` for `timesteps` (``restart``: schedules start over); return training statistics.

    Every `log_every` timesteps one point of the learning curve (``curve``) summarizes the episodes that ended
    since the last point: attack rate, rate of accidents of type `target`, mean episode reward and length, and
    the mean per-episode total of each named reward component (what Eureka's reflection feeds back)."""
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
            self.curve: list[dict[str, Any]] = []
            self.window: list[dict[str, Any]] = []
            self.returns: dict[int, float] = {}

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
                    info["accident"]["episode"] = self.episodes  # training episodes ended before this one
                    self.accidents += 1
                    if len(self.accident_log) < 2000:
                        self.accident_log.append(info["accident"])
                        self.accident_slots.append((buffer.pos, env_idx) if buffer is not None else None)
                    self.types[info["accident"]["accident_type"]] += 1
                    self.responsible += bool(info["accident"]["victim_responsible"])
                    if self.first_success is None:
                        self.first_success = self.num_timesteps
                self.returns[env_idx] = self.returns.get(env_idx, 0.0) + float(self.locals["rewards"][env_idx])
                if "attack" in info:
                    self.episodes += 1
                    attack = info["attack"]
                    self.window.append({**attack, "return": self.returns.pop(env_idx)})
            if self.num_timesteps % log_every < self.training_env.num_envs and self.window:
                self._point()
            return True

        def _point(self) -> None:
            eps, n = self.window, len(self.window)
            point = {
                "timesteps": self.num_timesteps,
                "episodes": n,
                "attack_rate": sum(e["victim_collision"] for e in eps) / n,
                "target_rate": sum(e["victim_collision"] and e["accident_type"] == target for e in eps) / n,
                "episode_reward": sum(e["return"] for e in eps) / n,
                "episode_length": sum(e["steps"] for e in eps) / n,
                "components": {
                    name: sum(e["reward_components"].get(name, 0.0) for e in eps) / n
                    for name in sorted({k for e in eps for k in e["reward_components"]})
                },
            }
            self.curve.append(point)
            self.window = []
            if log is not None:
                flat = {f"train/{k}": v for k, v in point.items() if k not in ("timesteps", "components")}
                flat.update({f"train/component/{k}": v for k, v in point["components"].items()})
                log(flat, self.num_timesteps)

    stats = AttackStats()
    model.learn(total_timesteps=timesteps, callback=stats, reset_num_timesteps=restart)
    if stats.window:
        stats._point()
    return {
        "curve": stats.curve,
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
