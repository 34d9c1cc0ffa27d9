"""How the AED jobs rehearse (`palaestra.shared.rehearse`): victims, then the attack, at a few hundred steps.

``aed.victim``: the same algorithm on the same scenario, 256 timesteps (one PPO rollout), every scenario.
``aed.attack``, kept: the victim kind and checkpoint, the placement, the taxonomy source (fixed and LLM-proposed),
both reward arms, Eureka's loop, the LLM judge and preference fine-tuning, the baselines and the network. Scaled:
one scenario (merge: the scenario placement's own case) with one fixed accident type (its first) and one
proposed, one Eureka round of one sample, a few hundred training steps in two environment processes, two
evaluation episodes, short LLM answers (the judge's too, over at most 8 pairs), one CPU per task, the local Ray
instance (each task takes minutes on two cores). The served LLM is the rehearsal's local server (``palaestra
serve`` over the small Qwen3-architecture model). The check loads every trained victim and adversary back with
stable-baselines3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from palaestra.shared.rehearse import Rehearsal, RehearsalContext

STEPS = 256
LLM_TOKENS = 64


def scale_victim(data: dict[str, Any], ctx: RehearsalContext) -> dict[str, Any]:
    return {"timesteps": STEPS}


def scale_attack(data: dict[str, Any], ctx: RehearsalContext) -> dict[str, Any]:
    from palaestra.aed.rewards import SCENARIO_TYPES

    scenarios = data.get("scenarios") or list(SCENARIO_TYPES)
    # one scenario is attacked (merge where listed: the scenario placement's own case; every task is minutes on
    # two cores), with its first type; the victims of all scenarios are still trained and reloaded
    scenario = "merge" if "merge" in scenarios else scenarios[0]
    types = [t for t in data.get("accident_types") or SCENARIO_TYPES[scenario] if t in SCENARIO_TYPES[scenario]]
    out: dict[str, Any] = {
        "scenarios": [scenario],
        "accident_types": types[:1],
        "proposals.n_types": 1,
        "proposals.max_tokens": LLM_TOKENS,
        "eureka.rounds": 1,
        "eureka.samples": 1,
        "eureka.timesteps": STEPS // 2,
        "eureka.eval_episodes": 1,
        "eureka.max_tokens": LLM_TOKENS,
        "preference.finetune_timesteps": STEPS // 2,
        "preference.judge_max_tokens": LLM_TOKENS,
        "preference.max_pairs": 8,
        "train.timesteps": STEPS,
        "train.n_envs": min(int(data.get("train", {}).get("n_envs", 1)), 2),
        "eval_episodes": 2,
        "video_episodes": 1,
        "cpus_per_task": 1,
        "max_retries": 0,
        "require_qualified_victim": False,  # a 256-step victim does not drive safely: the plumbing is rehearsed
    }
    if data.get("llm", {}).get("backend") == "openai":
        out.update({"llm.base_url": ctx.base_url, "llm.model": ctx.model})
    return out


def scale_qualify(data: dict[str, Any], ctx: RehearsalContext) -> dict[str, Any]:
    """One scenario (the attack's), its 100 episodes cut to 2 policy steps each."""
    scenarios = data.get("scenarios") or ["highway"]
    return {"scenarios": ["merge" if "merge" in scenarios else scenarios[0]], "max_steps": 2}


def served_llm(data: dict[str, Any]) -> bool:
    return data.get("llm", {}).get("backend") == "openai" and (
        data.get("rewards") in ("llm", "both")
        or data.get("taxonomy") in ("llm", "both")
        or data.get("preference", {}).get("judge") == "llm"
    )


def check_victim(cfg: Any, summary: dict[str, Any]) -> str:
    from stable_baselines3 import DQN, PPO

    path = Path(summary["checkpoint"])
    model = (PPO if cfg.algo == "ppo" else DQN).load(path, device="cpu")
    return f"victim {path.name} reloaded ({type(model).__name__})"


def check_attack(cfg: Any, summary: dict[str, Any]) -> str:
    from stable_baselines3 import DQN, PPO

    root = Path(cfg.tracking.artifact_root or cfg.output_dir)  # each policy is logged under its run's artifacts
    files = sorted(root.rglob("adversary_*.zip"))
    if not files:
        raise AssertionError(f"no trained adversary (adversary_*.zip) under {root}")
    loader = PPO if cfg.train.algo == "ppo" else DQN
    for path in files:
        loader.load(path, device="cpu")
    return f"{len(files)} adversary policies reloaded ({loader.__name__})"


VICTIM = Rehearsal(scale=scale_victim, check=check_victim)
QUALIFY = Rehearsal(scale=scale_qualify)
ATTACK = Rehearsal(scale=scale_attack, check=check_attack, served_llm=served_llm)
