"""The ``aed.victim`` job: trains the RL victim of a scenario (SB3 DQN/PPO) once and caches the checkpoint; later
runs, and ``aed.attack`` with ``victim: rl``, reuse it once ``aed.qualify`` has passed it.

DQN follows highway-env's recipe (``scripts/sb3_highway_dqn.py``: 256x256 MLP, lr 5e-4, buffer 15k, batch 32,
gamma 0.8, target update every 50 steps, 2e4 steps, SB3's default exploration over the first 10%). A victim
trained 6,000 steps with epsilon annealed over 70% of them crashed alone in 0.68 of episodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.aed.adversary import RLAlgo
from palaestra.shared.config import JobConfig, value_check
from palaestra.shared.jobs import job
from palaestra.shared.tracking import Tracker


@dataclass
class VictimConfig(JobConfig):
    job: str = "aed.victim"
    scenario: str = field(default="highway", metadata=value_check("palaestra.aed.attack:check_scenarios"))
    algo: RLAlgo = RLAlgo.dqn
    """dqn | ppo."""
    timesteps: int = 20_000
    """Training steps (highway-env's DQN recipes train 2e4-1e5)."""
    exploration_fraction: float = field(default=0.1, metadata=value_check("palaestra.aed.victim:check_fraction"))
    """DQN: share of the steps over which epsilon anneals from 1 to 0.05 (SB3's default, as in the recipe)."""
    env_overrides: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    """Where to cache the policy; default ``<output_dir>/victims/<scenario>_<algo>.zip``."""
    retrain: bool = False
    """Train again even if the checkpoint exists."""
    torch_threads: int = 1
    """As in the attack tasks: two threads on a shared core train the victim several times slower."""


def check_fraction(value: float, owner: Any) -> str | None:
    """A share of the training steps: in (0, 1]."""
    return None if 0 < value <= 1 else f"must be in (0, 1], got {value}"


@job("aed.victim", VictimConfig)
def victim(cfg: VictimConfig, tracker: Tracker) -> dict:
    """Train (once, then cached) the RL victim of a scenario with stable-baselines3."""
    from stable_baselines3 import DQN, PPO
    from stable_baselines3.common.monitor import Monitor

    from palaestra.aed.scenarios import make_base_env

    path = Path(cfg.checkpoint or Path(cfg.output_dir) / "victims" / f"{cfg.scenario}_{cfg.algo}.zip")
    if path.exists() and not cfg.retrain:
        print(f"[aed] victim checkpoint cached: {path}")
        return {"checkpoint": str(path), "cached": 1}
    env = Monitor(make_base_env(cfg.scenario, cfg.env_overrides))
    model: DQN | PPO
    if cfg.algo == "dqn":
        model = DQN(
            "MlpPolicy",
            env,
            learning_starts=200,
            buffer_size=15_000,
            learning_rate=5e-4,
            batch_size=32,
            gamma=0.8,
            train_freq=1,
            target_update_interval=50,
            exploration_fraction=cfg.exploration_fraction,
            policy_kwargs={"net_arch": [256, 256]},
            seed=cfg.seed,
            device="cpu",
            verbose=0,
        )
    else:
        model = PPO("MlpPolicy", env, n_steps=256, batch_size=64, gamma=0.8, seed=cfg.seed, device="cpu", verbose=0)
    model.learn(total_timesteps=cfg.timesteps, progress_bar=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(str(path))
    returns = env.get_episode_rewards()
    tail = returns[-10:] or [0.0]
    tracker.log_metrics({"victim/episodes": len(returns), "victim/return_last10": sum(tail) / len(tail)})
    tracker.log_artifact(path, "victim")
    return {"checkpoint": str(path), "cached": 0}
