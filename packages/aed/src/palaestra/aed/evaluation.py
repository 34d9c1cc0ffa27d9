"""Evaluating adversaries: attack rates with intervals, diversity of what was found, GIFs.

- `evaluate`: runs attack episodes with fixed episode seeds and returns, each
  with its 95% Wilson interval: the any-type attack success rate (victim
  collisions per episode), the *target-type* rate (accidents of the
  adversary's own type per episode: the headline metric), the share of
  accidents the victim is responsible for, and the accident records. Every
  record keeps what `palaestra.aed.replay` needs to re-simulate it: scenario,
  episode seed and index, the adversaries' action trace. ``policy=None`` is the
  random adversary; `IdlePolicy` the passive one.
- Diversity over what was found: `type_entropy` (over accident types) and
  `trajectory_diversity` (mean pairwise distance between accident feature
  vectors: contact geometry and the adversary's last steps before contact).
- `record_gif`: renders headless (rgb_array) until an accident of the wanted
  type happens and writes a GIF with imageio, or says none was found.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from palaestra.aed.adversary import AdversarySpec, make_env
from palaestra.shared.stats import wilson_interval


class IdlePolicy:
    """Passive adversaries: every one keeps its lane and speed (IDLE), for the victim's own accident rate."""

    def __init__(self, num_adversaries: int = 1):
        from palaestra.aed.scenarios import ACTIONS

        idle = ACTIONS.index("IDLE")
        self.action = idle if num_adversaries == 1 else np.full(num_adversaries, idle)

    def predict(self, obs, deterministic: bool = True):
        return self.action, None


def evaluate(policy, spec: AdversarySpec, episodes: int, seed: int) -> dict[str, Any]:
    """Run `episodes` attacks on episode seeds ``seed + i`` (policy None: uniformly random adversary actions)."""
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
            accidents.append({**summary["accident"], "episode": ep})
    env.close()
    return summarize(accidents, episodes, returns, target=spec.accident_type)


def summarize(
    accidents: list[dict], episodes: int, returns: list[float] | None = None, target: str | None = None
) -> dict[str, Any]:
    """``asr`` (accidents per episode), ``target_rate`` (accidents of type `target` per episode),
    ``responsible_rate`` (share of accidents the victim is responsible for), ``effective_asr`` (responsible
    accidents per episode), each with its 95% Wilson interval (``<name>_ci``)."""
    types = Counter(a["accident_type"] for a in accidents)
    responsible = sum(bool(a["victim_responsible"]) for a in accidents)
    hits = types.get(target, 0) if target else 0
    return {
        "episodes": episodes,
        "asr": len(accidents) / max(1, episodes),
        "asr_ci": wilson_interval(len(accidents), episodes),
        "target_type": target or "",
        "target_count": hits,
        "target_rate": hits / max(1, episodes),
        "target_rate_ci": wilson_interval(hits, episodes),
        "responsible_rate": responsible / len(accidents) if accidents else 0.0,
        "responsible_rate_ci": wilson_interval(responsible, len(accidents)),
        "effective_asr": responsible / max(1, episodes),
        "effective_asr_ci": wilson_interval(responsible, episodes),
        "types": dict(types),
        "trajectory_diversity": trajectory_diversity([a["features"] for a in accidents if "features" in a]),
        "mean_return": float(np.mean(returns)) if returns else 0.0,
        "accidents": accidents,
    }


def type_rate(result: dict[str, Any], accident_type: str) -> tuple[float, tuple[float, float]]:
    """Accidents of `accident_type` per episode in an `evaluate` result (e.g. a baseline's), with its interval."""
    n = result["types"].get(accident_type, 0)
    return n / max(1, result["episodes"]), wilson_interval(n, result["episodes"])


def type_entropy(counts: dict[str, int]) -> float:
    """Shannon entropy (nats) of the accident-type distribution."""
    total = sum(counts.values())
    if not total:
        return 0.0
    p = np.asarray([c / total for c in counts.values() if c])
    return float(-(p * np.log(p)).sum())


def trajectory_diversity(features: list[list[float]]) -> float:
    """Mean pairwise Euclidean distance between accident feature vectors (0 with fewer than two accidents)."""
    if len(features) < 2:
        return 0.0
    x = np.asarray(features, float)
    d = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    n = len(x)
    return float(d.sum() / (n * (n - 1)))


def record_gif(
    policy, spec: AdversarySpec, path: str | Path, seed: int, max_episodes: int = 5, fps: int = 8
) -> dict[str, Any]:
    """Render attacks headless until one ends in an accident of ``spec.accident_type`` and write it as a GIF;
    else the last accident of another type, else the last episode. Returns the episode's summary with
    ``shows``: ``target`` | ``other_type`` | ``no_accident``."""
    import imageio.v2 as imageio

    env = make_env(spec, render=True)
    chosen: list = []
    summary: dict[str, Any] = {}
    for ep in range(max_episodes):
        obs, _ = env.reset(seed=seed + ep)
        frames, done = [env.render()], False
        env.on_frame = frames.append
        while not done:
            action = env.action_space.sample() if policy is None else policy.predict(obs, deterministic=True)[0]
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        attack = info["attack"]
        if not chosen or attack["victim_collision"] or not summary["victim_collision"]:
            chosen, summary = frames, attack
        if attack["victim_collision"] and attack["accident_type"] == spec.accident_type:
            break
    env.close()
    gif: list[Any] = [np.asarray(f) for f in chosen] + [np.asarray(chosen[-1])] * fps
    imageio.mimsave(str(path), gif, duration=1.0 / fps, loop=0)
    if not summary["victim_collision"]:
        shows = "no_accident"
    else:
        shows = "target" if summary["accident_type"] == spec.accident_type else "other_type"
    return {**summary, "shows": shows}
