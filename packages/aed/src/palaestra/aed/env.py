"""The adversary's environment: NPCs near the victim taken over as RL-controlled vehicles.

`AdversaryEnv` is a single-agent gymnasium environment (SB3's ``check_env``
accepts it). After every reset of the highway-env scenario:

- the victim is the scenario's ego vehicle, either replaced by a rule-based
  ``IDMVehicle`` (``victim="idm"``) or kept as an ``MDPVehicle`` driven by a
  frozen SB3 policy (``victim="rl"``, from a checkpoint of the ``aed.victim`` job);
- the ``num_adversaries`` NPCs nearest to the victim are replaced by
  ``MDPVehicle.create_from(npc)``; one policy drives them all (joint action:
  ``Discrete(5)`` for one adversary, ``MultiDiscrete([5] * n)`` for several).

The road is stepped frame by frame through `attribution.step_road`, so every
collision gets a `CollisionRecord`; those involving the victim are classified
into the accident taxonomy and judged (AV responsible or not).

Rewards come from a function of the documented state (see
`palaestra.aed.rewards.STATE_API`), by default the expert reward of
``accident_type``. A reward may return named components (a dict of floats,
summed; their per-episode totals are reported for Eureka's reflection). If
that function fails (e.g. sandboxed LLM code that is killed), the env says so
in ``info["reward_error"]`` and switches to the expert reward for the rest of
its life: training goes on. A type without an expert reward (LLM-proposed)
runs on its LLM reward alone; its fallback is `rewards.generic_reward`.

Accident types come from ``classifier`` (a `CollisionRecord` -> type name),
by default `attribution.classify` over the fixed taxonomy; LLM-proposed types
bring their own sandboxed recognizers (`palaestra.aed.proposals`).

Every accident record keeps the scenario, the episode's reset seed and the
adversaries' action trace up to the contact: `palaestra.aed.replay`
re-simulates it.

With a preference model (fine-tuning), accidents it scores effective earn
``effective_bonus``, ineffective ones nothing minus ``ineffective_penalty``,
and every step near the victim earns ``responsibility_shaping`` times its
verdict on the contact that would happen now (see `palaestra.aed.preference`).
Each adversary observes what rule 3 of the judge looks at: how long it has been
in the victim's lane and its hardest braking over the last second.

Episodes end when the victim crashes (the accident is counted once, on that
step; gymnasium 1.x vector envs autoreset on the *next* step, so counting on
the terminal step never double counts), when every adversary has crashed, or
at ``max_steps`` (truncated).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from palaestra.aed.attribution import History, classify, lane_str, make_record, relative, step_road
from palaestra.aed.judge import RuleJudge
from palaestra.aed.preference import accident_features
from palaestra.aed.rewards import reward_value
from palaestra.aed.scenarios import ACTIONS, get_scenario, make_base_env, move_beside, restore_idm_defaults

NEIGHBOURS = 4
OWN_F, VICTIM_F, OTHER_F = 6, 8, 5


class AdversaryEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        scenario: str = "highway",
        accident_type: str = "rear_end",
        victim: str = "idm",
        victim_checkpoint: str | None = None,
        num_adversaries: int = 1,
        reward_fn: Callable[[dict], float | dict[str, float]] | None = None,
        classifier: Callable | None = None,
        judge: Callable | None = None,
        accident_filter: Callable[[dict], bool] | None = None,
        effective_bonus: float = 0.0,
        ineffective_penalty: float = 0.0,
        responsibility_score: Callable[[list[float]], float] | None = None,
        responsibility_shaping: float = 0.0,
        overrides: dict[str, Any] | None = None,
        max_steps: int | None = None,
        render_mode: str | None = None,
        placement: str = "nearest",
    ):
        from palaestra.aed.rewards import EXPERT_REWARDS, generic_reward

        if victim not in ("idm", "rl"):
            raise ValueError(f"victim must be 'idm' or 'rl', got {victim!r}")
        if victim == "rl" and not victim_checkpoint:
            raise ValueError("victim='rl' needs victim_checkpoint (train one with the aed.victim job)")
        if num_adversaries < 1:
            raise ValueError(f"num_adversaries must be >= 1, got {num_adversaries}")
        if placement not in ("nearest", "scenario"):
            raise ValueError(f"placement must be 'nearest' or 'scenario', got {placement!r}")
        self.placement = placement
        self.spec_ = get_scenario(scenario)
        self.scenario, self.accident_type = scenario, accident_type
        self.base = make_base_env(self.spec_, overrides, render=render_mode == "rgb_array")
        self.render_mode = render_mode
        self.victim_kind, self.n_adv = victim, num_adversaries
        self.victim_policy = _load_policy(victim_checkpoint) if victim == "rl" else None
        self.expert = EXPERT_REWARDS.get(accident_type) or generic_reward(accident_type)
        self.reward_fn = reward_fn or self.expert
        self.classifier = classifier or (lambda rec: classify(rec, self.scenario))
        self.reward_error: str | None = None
        self.judge = judge or RuleJudge()
        self.accident_filter = accident_filter
        self.effective_bonus = effective_bonus
        self.ineffective_penalty = ineffective_penalty
        self.responsibility_score = responsibility_score
        self.responsibility_shaping = responsibility_shaping
        self.max_steps = max_steps or self.spec_.max_steps
        width = OWN_F + VICTIM_F + OTHER_F * NEIGHBOURS
        self.observation_space = gym.spaces.Box(-5.0, 5.0, (num_adversaries * width,), np.float32)
        self.action_space = (
            gym.spaces.Discrete(5) if num_adversaries == 1 else gym.spaces.MultiDiscrete([5] * num_adversaries)
        )
        self.steps = 0
        self.on_frame: Callable[[np.ndarray], None] | None = None
        """Called with an rgb frame after every simulation frame (videos at the simulation frequency)."""

    # -- gymnasium API ----------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31))
        self.episode_seed = int(seed)
        self.actions: list = []
        self.components: dict[str, float] = {}
        restore_idm_defaults()  # another scenario's reset in this process may have changed them
        self.base.reset(seed=seed)
        self._take_over()
        self.steps = 0
        self.t = 0.0
        self.records: list = []
        self.accident: dict | None = None
        self.recent: list[dict] = []
        return self._observe(), {}

    def step(self, action):
        from highway_env.vehicle.controller import MDPVehicle  # noqa: F401

        acts = np.atleast_1d(np.asarray(action)).astype(int)
        self.actions.append(int(acts[0]) if self.n_adv == 1 else [int(a) for a in acts])
        for adv, a in zip(self.advs, acts):
            if not adv.crashed:
                adv.act(ACTIONS[int(a)])
        if self.victim_policy is not None and not self.victim.crashed:
            obs = self.base.observation_type.observe()
            victim_action, _ = self.victim_policy.predict(obs, deterministic=True)
            self.victim.act(self.base.action_type.actions[int(victim_action)])
        cfg = self.base.config
        frames = int(cfg["simulation_frequency"] // cfg["policy_frequency"])
        dt = 1.0 / cfg["simulation_frequency"]
        new = []
        for _ in range(frames):
            new += step_road(self.base.road, dt, self.t, self.steps, self.roles, self.history)
            self.t += dt
            for v in [self.victim, *self.advs]:
                if v.crashed:
                    v.color = None  # crashed vehicles show red in videos
            if self.on_frame is not None:
                self.on_frame(self.render())
        self.steps += 1
        victim_recs = [r for r in new if r.a_role == "victim"]
        for rec in victim_recs:
            rec.accident_type = self.classifier(rec)
            rec.victim_responsible = bool(self.judge(rec))
        self.records += new
        event = self._event(new, victim_recs)
        states = [self.state(i, event) for i in range(self.n_adv)]
        self.recent = (self.recent + [states[0]])[-5:]
        reward = sum(self._reward(s) for s in states)
        if self.responsibility_score is not None and self.responsibility_shaping and not victim_recs:
            reward += self._responsibility_shaping(states)
        info: dict[str, Any] = {"collisions": [r.to_dict() for r in new]}
        if victim_recs and self.accident is None:
            rec = victim_recs[0]
            self.accident = {
                **rec.to_dict(),
                "features": accident_features(rec, self.recent),
                "scenario": self.scenario,
                "seed": self.episode_seed,
                "actions": list(self.actions),
            }
            if self.accident_filter is not None:
                if self.accident_filter(self.accident):
                    reward += self.effective_bonus
                else:
                    # judged ineffective by the preference model: earns nothing, or a penalty so that the
                    # adversary unlearns ramming the victim instead of merely not being paid for it
                    reward = min(reward, 0.0) - self.ineffective_penalty
                    self.accident["filtered"] = True
            info["accident"] = self.accident
        if self.reward_error:
            info["reward_error"] = self.reward_error
        terminated = bool(self.victim.crashed or all(a.crashed for a in self.advs))
        truncated = not terminated and self.steps >= self.max_steps
        if terminated or truncated:
            info["attack"] = self.summary()
        return self._observe(), float(reward), terminated, truncated, info

    def render(self):
        return self.base.render()

    def close(self):
        self.base.close()
        for part in (self.classifier, self.reward_fn):
            if hasattr(part, "close"):  # sandboxed recognizers / reward code hold processes
                part.close()

    # -- episode bookkeeping ---------------------------------------------------
    def summary(self) -> dict[str, Any]:
        acc = self.accident
        return {
            "victim_collision": acc is not None,
            "accident_type": acc["accident_type"] if acc else "",
            "victim_responsible": bool(acc and acc["victim_responsible"]),
            "steps": self.steps,
            "adv_crashes_other": sum(1 for r in self.records if r.a_role.startswith("adv") and r.b_role != "victim"),
            "reward_components": dict(self.components),
            "seed": self.episode_seed,
            "accident": acc,
        }

    def _responsibility_shaping(self, states: list[dict]) -> float:
        """Dense preference reward: the reward model's verdict on the contact that would happen now.

        For each adversary near the victim, the victim-adversary pair is recorded as if it touched this frame
        (same geometry, lanes, braking history as a real `CollisionRecord`) and scored by the Bradley-Terry
        model; tanh(score - threshold) > 0 means the judge would hold the victim responsible. Weighted by
        proximity, so only imminent contacts count."""
        total = 0.0
        for i, (adv, state) in enumerate(zip(self.advs, states)):
            near = max(0.0, 1.0 - state["rel"]["dist"] / 30.0)
            if adv.crashed or near <= 0.0:
                continue
            rec = make_record(self.victim, adv, "victim", f"adv{i}", self.t, self.steps, self.history)
            score = self.responsibility_score
            assert score is not None  # checked by the caller
            total += near * math.tanh(score(accident_features(rec, self.recent)))
        return self.responsibility_shaping * total

    def _reward(self, state: dict) -> float:
        try:
            value, parts = reward_value(self.reward_fn(state))
        except Exception as err:  # a broken reward must not stop training: fall back to the expert's
            if self.reward_fn is self.expert:
                raise
            self.reward_error = f"{type(err).__name__}: {err}"
            self.reward_fn = self.expert
            value, parts = reward_value(self.expert(state))
        for name, v in parts.items():  # named components (Eureka's reflection): the reward is their sum
            self.components[name] = self.components.get(name, 0.0) + v
        return value

    def _take_over(self) -> None:
        from highway_env.vehicle.behavior import IDMVehicle
        from highway_env.vehicle.controller import MDPVehicle

        road = self.base.road
        ego = self.base.vehicle
        if self.victim_kind == "idm":
            victim = IDMVehicle.create_from(ego)
            road.vehicles[road.vehicles.index(ego)] = victim
        else:
            victim = ego
        self.victim = victim
        self.base.controlled_vehicles = [victim]  # the viewer follows the victim
        npcs = sorted(
            (v for v in road.vehicles if v is not victim), key=lambda v: np.linalg.norm(v.position - victim.position)
        )
        own = self.spec_.adversary_lanes if self.placement == "scenario" else ()
        if own:  # the scenario's own adversaries first, moved beside the victim (e.g. merge: the ramp car)
            npcs = [v for v in npcs if v.lane_index[:2] in own] + [v for v in npcs if v.lane_index[:2] not in own]
            for v in npcs[: self.n_adv]:
                if v.lane_index[:2] in own:
                    move_beside(v, victim, self.spec_.adversary_offset_m, road)
        if len(npcs) < self.n_adv:
            raise RuntimeError(f"{self.scenario}: only {len(npcs)} NPCs for {self.n_adv} adversaries")
        # adversaries may brake to a standstill (highway-env's default speeds 20-30 m/s would forbid brake checks)
        top = float(max(self.base.config["action"].get("target_speeds", MDPVehicle.DEFAULT_TARGET_SPEEDS)))
        speeds = np.linspace(0.0, top, 7)
        self.advs = []
        for npc in npcs[: self.n_adv]:
            adv = MDPVehicle.create_from(npc)
            adv.target_speeds = speeds
            adv.speed_index = adv.speed_to_index(adv.target_speed)
            adv.target_speed = adv.index_to_speed(adv.speed_index)
            road.vehicles[road.vehicles.index(npc)] = adv
            self.advs.append(adv)
        victim.color = (50, 200, 0)  # videos: victim green, adversaries orange, NPCs blue
        for adv in self.advs:
            adv.color = (255, 140, 0)
        self.roles = {id(victim): "victim", **{id(a): f"adv{i}" for i, a in enumerate(self.advs)}}
        self.history = History(int(self.base.config["simulation_frequency"]))
        self.history.record(0.0, road.vehicles)

    # -- observations and the reward state ---------------------------------------
    def _observe(self) -> np.ndarray:
        parts = []
        for adv in self.advs:
            lane_changing = float(adv.target_lane_index != adv.lane_index)
            # what the judge will look at (rule 3): how long the adversary has been in the victim's lane,
            # and its hardest braking over the last second (below -5 m/s^2 counts as a brake check)
            settled = self.history.time_in_lane(adv, self.victim.lane_index) / 4
            braking = max(self.history.min_accel(adv), -20.0) / 10
            own = [adv.speed / 30, math.cos(adv.heading), math.sin(adv.heading), lane_changing, settled, braking]
            long, lat = relative(adv, self.victim)
            dv = self.victim.velocity - adv.velocity
            hd = self.victim.heading - adv.heading
            same = float(self.victim.lane_index == adv.lane_index)
            victim_changing = float(getattr(self.victim, "target_lane_index", None) != self.victim.lane_index)
            vic = [long / 50, lat / 10, dv[0] / 20, dv[1] / 20, math.cos(hd), math.sin(hd), same, victim_changing]
            others = sorted(
                (v for v in self.base.road.vehicles if v is not adv and v is not self.victim),
                key=lambda v: np.linalg.norm(v.position - adv.position),
            )[:NEIGHBOURS]
            rest = []
            for v in others:
                lo, la = relative(adv, v)
                d = v.velocity - adv.velocity
                rest += [1.0, lo / 50, la / 10, d[0] / 20, d[1] / 20]
            rest += [0.0] * (OTHER_F * NEIGHBOURS - len(rest))
            parts += own + vic + rest
        return np.clip(np.asarray(parts, np.float32), -5, 5)

    def _event(self, new, victim_recs) -> dict:
        rec = victim_recs[0] if victim_recs else None
        return {
            "victim_collision": float(rec is not None),
            "with_adversary": float(rec is not None and rec.b_role.startswith("adv")),
            "accident_type": rec.accident_type if rec else "",
            "victim_responsible": float(bool(rec and rec.victim_responsible)),
            "striker_is_victim": float(rec is not None and rec.striker == "victim"),
            "adv_roles_crashed_other": [r.a_role for r in new if r.a_role.startswith("adv") and r.b_role != "victim"],
        }

    def state(self, i: int, event: dict) -> dict:
        """The reward state of adversary `i` (documented in palaestra.aed.rewards.STATE_API)."""
        adv, victim = self.advs[i], self.victim
        long, lat = relative(victim, adv)
        dist = float(np.linalg.norm(adv.position - victim.position))
        closing = float(np.dot(victim.velocity - adv.velocity, (adv.position - victim.position) / max(dist, 1e-6)))
        ttc = dist / closing if closing > 0.1 else 99.0
        ev = {k: v for k, v in event.items() if k != "adv_roles_crashed_other"}
        ev["adv_crashed_other"] = float(f"adv{i}" in event["adv_roles_crashed_other"])
        return {
            "t": self.t,
            "step": float(self.steps),
            "scenario": self.scenario,
            "adv": _vehicle_state(adv, self.base.road),
            "victim": _vehicle_state(victim, self.base.road),
            "rel": {
                "long": long,
                "lat": lat,
                "dist": dist,
                "same_lane": float(adv.lane_index == victim.lane_index),
                "in_victim_lane_s": float(self.history.time_in_lane(adv, victim.lane_index)),
                "closing_speed": closing,
                "ttc": min(ttc, 99.0),
                "heading_diff": float((adv.heading - victim.heading + math.pi) % (2 * math.pi) - math.pi),
            },
            "event": ev,
        }


def _vehicle_state(v, road) -> dict:
    lane = road.network.get_lane(v.lane_index)
    return {
        "x": float(v.position[0]),
        "y": float(v.position[1]),
        "vx": float(v.velocity[0]),
        "vy": float(v.velocity[1]),
        "speed": float(v.speed),
        "heading": float(v.heading),
        "lane_id": float(v.lane_index[2]) if v.lane_index else 0.0,
        "lane": lane_str(v.lane_index),
        "lane_changing": float(getattr(v, "target_lane_index", v.lane_index) != v.lane_index),
        "on_road": float(lane.on_lane(v.position)),
        "crashed": float(v.crashed),
    }


def _load_policy(path: str | None):
    from pathlib import Path

    from stable_baselines3 import DQN, PPO

    if path is None or not Path(path).exists():
        raise FileNotFoundError(f"victim checkpoint not found: {path} (train one with the aed.victim job)")
    algo = PPO if "ppo" in Path(path).name.lower() else DQN
    return algo.load(path, device="cpu")
