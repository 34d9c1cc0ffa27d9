"""Accident taxonomy, the reward state API, and the expert reward per accident type.

A reward is ``reward(state) -> float`` called once per adversary per policy
step (rewards of several adversaries are summed). `STATE_API` documents the
state; the same text is what the LLM sees when it writes reward code.

The expert rewards are the baseline: shaping toward the accident type's
pre-crash geometry plus a bonus when the victim collides in a contact of the
target type (nothing for other types: with a smaller bonus for any accident,
the adversaries settled for the easiest type, side-swipes, whatever their
target), and a penalty when the adversary crashes into someone else or leaves
the road. They do not look at AV responsibility: the
preference model adds that.

Rewards are registered in ``palaestra.shared.rewards.REWARDS`` as
``aed/expert/<type>`` (and LLM-written ones as ``aed/llm/<scenario>/<type>``
at run time) with the registry's signature ``(sample, completion="", **info)``
where ``sample`` is the state.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from palaestra.aed.attribution import CUT_IN_WINDOW_S
from palaestra.shared.rewards import REWARDS

RewardFn = Callable[[dict], float | dict[str, float]]
"""A reward over the state API: a float, or a dict of named components (summed)."""

TAXONOMY: dict[str, str] = {
    "rear_end": "a longitudinal collision within one lane: one vehicle drives into the back of the other",
    "side_swipe": "side contact while a vehicle changes lanes next to the victim",
    "cut_in": "a vehicle enters the victim's lane just ahead of it and the victim hits it",
    "merge_conflict": "collision at a lane merge (on-ramp joining the main road)",
    "intersection_crossing": "collision between crossing paths at an intersection",
    "roundabout_entry": "collision while a vehicle enters or leaves a roundabout",
}
"""Default accident taxonomy (DESIGN.md); `attribution.classify` maps a contact to one of these (or 'obstacle')."""

SCENARIO_TYPES: dict[str, list[str]] = {
    "highway": ["rear_end", "side_swipe", "cut_in"],
    "merge": ["merge_conflict", "rear_end", "side_swipe"],
    "roundabout": ["roundabout_entry", "rear_end"],
    "intersection": ["intersection_crossing", "rear_end"],
}

STATE_API = """\
reward(state) -> float is called once per policy step (1 s of simulated time in highway, 1/1 Hz elsewhere).
`state` is a dict (all numbers are floats; distances in metres, speeds in m/s, angles in radians):
  state["t"]: seconds since the episode began;  state["step"]: policy step;  state["scenario"]: str
  state["adv"], state["victim"]: the adversary you control and the victim (the automated vehicle under test), each
      {"x", "y", "vx", "vy", "speed", "heading", "lane_id" (lane number on its road segment, 0 = leftmost),
       "lane" (str, road segment and lane), "lane_changing" (1 while changing lanes), "on_road" (1/0), "crashed" (1/0)}
  state["rel"]: the adversary relative to the victim:
      {"long": longitudinal offset in the victim's frame (+ = adversary ahead of the victim),
       "lat": lateral offset (+ = toward the victim's right-hand lanes), "dist": centre distance,
       "same_lane": 1 if both are in the same lane,
       "in_victim_lane_s": how long the adversary has been in the victim's lane (0 when not in it; 4 = 4 s or more),
       "closing_speed": speed at which the gap shrinks (+ = closing),
       "ttc": time to collision (99 when not closing), "heading_diff": adversary heading minus victim heading}
  state["event"]: what happened during this step:
      {"victim_collision": 1 if the victim collided with anyone this step,
       "with_adversary": 1 if that collision was with an adversary,
       "accident_type": str, one of rear_end, side_swipe, cut_in, merge_conflict, intersection_crossing,
                        roundabout_entry, obstacle ("" when no collision),
       "victim_responsible": 1 if the rule-based judge holds the victim responsible,
       "striker_is_victim": 1 if the victim's motion caused the contact,
       "adv_crashed_other": 1 if this adversary crashed into someone other than the victim}
Only the `math` module is available (no imports). The function must return a finite float, or a dict of named
finite floats (its components, e.g. {"proximity": ..., "collision": ...}): the reward is their sum, and each
component's statistics over training are reported back to you.
"""


LANE_WIDTH_M = 4.0
"""highway-env's ``StraightLane.DEFAULT_WIDTH``: the lateral offset of a neighbouring lane's centre."""
VEHICLE_LENGTH_M = 5.0
"""highway-env's ``Vehicle.LENGTH``: centre offset minus this is the bumper-to-bumper gap of two vehicles in line."""


def _collision_bonus(state: dict, target: str) -> float:
    event = state["event"]
    if event["victim_collision"]:
        return 10.0 if event["accident_type"] == target else 0.0
    if event["adv_crashed_other"] or not state["adv"]["on_road"]:
        return -3.0
    return 0.0


def _proximity(state: dict, scale: float = 40.0) -> float:
    return 0.1 * max(0.0, 1.0 - state["rel"]["dist"] / scale)


def rear_end(state: dict) -> float:
    """Share the victim's lane close to it (ahead: slow down so that it runs into the back; behind: close in)."""
    rel = state["rel"]
    shaping = _proximity(state)
    if rel["same_lane"]:
        near = max(0.0, 1.0 - abs(abs(rel["long"]) - 8.0) / 20.0)
        shaping += 0.2 * near + 0.05 * max(0.0, rel["closing_speed"]) / 5
    return shaping + _collision_bonus(state, "rear_end")


def cut_in(state: dict) -> dict[str, float]:
    """Get just ahead of the victim in a neighbouring lane while it is faster, change into its lane at a short gap,
    and be struck from behind within the cut-in window (`attribution.classify`: 3 s after entering its lane).

    Components: ``setup`` (closeness to the launch point: a neighbouring lane, bumper gap 3 m ahead, more while
    the victim closes in), ``merge`` (on the step the adversary enters the victim's lane ahead of it: larger for a
    shorter gap and a faster victim), ``hold`` (ahead in its lane while it closes in, within the window), and the
    bonus for a cut-in accident only. A merge pays several steps' worth of setup, so that waiting beside the
    victim is not the best use of an episode; it pays nothing under a 1 m gap, which ends in clipping the victim's
    front corner (a side-swipe). Weights and shapes are our choice (the AED paper describes its expert rewards
    only in words)."""
    rel = state["rel"]
    gap = rel["long"] - VEHICLE_LENGTH_M  # bumper to bumper, + = the adversary's back ahead of the victim's front
    closing = max(0.0, min(rel["closing_speed"], 8.0)) / 8.0
    merge = hold = 0.0
    slot = math.exp(-(((gap - 3.0) / 10.0) ** 2) - ((abs(rel["lat"]) - LANE_WIDTH_M) / 3.0) ** 2)
    setup = 0.15 * slot * (0.5 + 0.5 * closing)
    if rel["same_lane"] and 0.0 < gap < 15.0:
        setup = 0.0
        if rel["in_victim_lane_s"] < 1.0 and gap > 1.0:  # entered during this step (a policy step is 1 s here)
            merge = 2.0 * (1.0 - gap / 15.0) * (0.5 + 0.5 * closing)
        elif rel["in_victim_lane_s"] < CUT_IN_WINDOW_S:
            hold = 0.2 * closing
    return {"setup": setup, "merge": merge, "hold": hold, "collision": _collision_bonus(state, "cut_in")}


def side_swipe(state: dict) -> float:
    """Drive alongside the victim (adjacent lane, overlapping longitudinally) and swerve into it."""
    rel = state["rel"]
    shaping = _proximity(state)
    if abs(rel["long"]) < 8 and not rel["same_lane"]:
        shaping += 0.2 * (1.0 - abs(rel["long"]) / 8.0)
    return shaping + _collision_bonus(state, "side_swipe")


def _conflict(target: str) -> Callable[[dict], float]:
    def reward(state: dict) -> float:
        closing = max(0.0, state["rel"]["closing_speed"]) / 10.0
        return 2 * _proximity(state, 60.0) + 0.05 * closing + _collision_bonus(state, target)

    reward.__name__ = target
    reward.__doc__ = f"Approach the victim's path near the conflict zone and collide there ({target})."
    return reward


EXPERT_REWARDS: dict[str, RewardFn] = {
    "rear_end": rear_end,
    "cut_in": cut_in,
    "side_swipe": side_swipe,
    "merge_conflict": _conflict("merge_conflict"),
    "intersection_crossing": _conflict("intersection_crossing"),
    "roundabout_entry": _conflict("roundabout_entry"),
}


def generic_reward(target: str) -> Callable[[dict], float]:
    """The reward of a type with no expert reward (e.g. LLM-proposed), used only when its LLM reward fails:
    closeness to the victim and the collision bonus of `target` (no type-specific shaping)."""

    def reward(state: dict) -> float:
        return _proximity(state) + _collision_bonus(state, target)

    reward.__name__ = f"generic_{target}"
    return reward


class RewardError(RuntimeError):
    """A reward function returned something that is not a reward; the message says why."""


def reward_value(value: Any) -> tuple[float, dict[str, float]]:
    """The reward (a finite float) and its named components of what a reward function returned; anything else
    (a string, nan, inf, a non-numeric component) raises `RewardError`, inside the caller's fallback."""
    parts = value if isinstance(value, dict) else {"": value}
    floats: dict[str, float] = {}
    for name, v in parts.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise RewardError(f"reward component {str(name)[:64]!r} is a {type(v).__name__}, not a number")
        try:
            floats[str(name)] = float(v)
        except OverflowError:
            raise RewardError(f"reward component {str(name)[:64]!r} does not fit a float") from None
    total = sum(floats.values())
    if not all(math.isfinite(v) for v in [*floats.values(), total]):
        raise RewardError(f"non-finite reward {total!r}")
    return total, floats if isinstance(value, dict) else {}


def expert_reward(accident_type: str) -> RewardFn:
    if accident_type not in EXPERT_REWARDS:
        raise ValueError(f"unknown accident type '{accident_type}' (known: {', '.join(EXPERT_REWARDS)})")
    return EXPERT_REWARDS[accident_type]


def as_registry_reward(fn: RewardFn) -> Callable:
    """Adapt ``reward(state)`` to the registry's ``(sample, completion, **info)`` signature."""

    def registered(sample, completion: str = "", **info) -> float:
        value = fn(sample)
        return float(sum(value.values())) if isinstance(value, dict) else value

    registered.__name__ = getattr(fn, "__name__", "reward")
    registered.__doc__ = fn.__doc__
    return registered


def register_reward(name: str, fn: RewardFn) -> str:
    """(Re)register `fn` under `name` in the shared reward registry; return the name."""
    if name in REWARDS:
        REWARDS.unregister(name)
    REWARDS.register(name, as_registry_reward(fn))
    return name


for _type, _fn in EXPERT_REWARDS.items():
    register_reward(f"aed/expert/{_type}", _fn)
