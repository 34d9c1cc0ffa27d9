"""Driving scenarios: highway-env environments with pinned versions and env ids.

highway-env 1.12 renamed several environments to ``-v1``/``-v2`` (the ``-v0``
ids still exist but warn as out of date), so the ids are pinned here and
`check_versions` refuses any other highway-env version: a silent rename would
change the dynamics under every experiment.

Each scenario forces ``DiscreteMetaAction`` (LANE_LEFT, IDLE, LANE_RIGHT,
FASTER, SLOWER) so that adversaries and an RL victim drive through the same
high-level actions, and keeps the scenario's own target speeds.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

HIGHWAY_ENV_VERSION = "1.12.1"
ACTIONS = ("LANE_LEFT", "IDLE", "LANE_RIGHT", "FASTER", "SLOWER")
"""The discrete meta-actions of highway-env's ``DiscreteMetaAction`` (index -> name)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    env_id: str
    """gymnasium id registered by highway-env 1.12.1."""
    max_steps: int
    """Policy steps per episode (the adversary env truncates here)."""
    config: dict[str, Any] = field(default_factory=dict)
    """highway-env config overrides applied before every reset."""
    adversary_lanes: tuple[tuple[str, str], ...] = ()
    """Road segments whose NPCs become adversaries first under ``adversary_placement: scenario`` (where the
    scenario's own accident types happen: merge, the on-ramp)."""
    adversary_offset_m: float = 0.0
    """Such an adversary is moved along its lane to the victim's longitudinal position plus this, at the victim's
    speed, so that both reach the conflict zone together."""


class AdversaryPlacement(StrEnum):
    """Which NPCs become adversaries: the ones nearest the victim, or the scenario's own (`Scenario.adversary_lanes`,
    then the nearest)."""

    nearest = "nearest"
    scenario = "scenario"


SCENARIOS: dict[str, Scenario] = {
    "highway": Scenario("highway", "highway-fast-v0", 30, {"vehicles_count": 20}),
    # the ramp car starts 80 m ahead of the victim: merge conflicts need it moved beside the victim
    "merge": Scenario("merge", "merge-v1", 30, adversary_lanes=(("j", "k"), ("k", "b")), adversary_offset_m=5.0),
    "roundabout": Scenario("roundabout", "roundabout-v1", 20),
    "intersection": Scenario("intersection", "intersection-v2", 20, {"duration": 20}),
}


def get_scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        import difflib

        close = difflib.get_close_matches(name, SCENARIOS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"unknown scenario '{name}'{hint} (known: {', '.join(SCENARIOS)})")
    return SCENARIOS[name]


def check_versions() -> None:
    """Refuse a highway-env other than the pinned one (env ids and dynamics differ between releases)."""
    from importlib.metadata import version

    found = version("highway-env")
    if found != HIGHWAY_ENV_VERSION:
        raise RuntimeError(f"palaestra-aed needs highway-env=={HIGHWAY_ENV_VERSION}, found {found}")


IDM_DEFAULTS = {"DISTANCE_WANTED": 10.0, "COMFORT_ACC_MAX": 3.0, "COMFORT_ACC_MIN": -5.0}
"""``IDMVehicle``'s class defaults in highway-env 1.12.1. ``intersection-v2`` overwrites them on the class at every
reset (7, 6, -3), which changed every IDM vehicle of any scenario simulated later in the same process."""


def restore_idm_defaults() -> None:
    """Undo ``intersection-v2``'s class-wide IDM changes (it applies them again at its own resets)."""
    from highway_env.vehicle.behavior import IDMVehicle

    for key, value in IDM_DEFAULTS.items():
        setattr(IDMVehicle, key, value)


def move_beside(vehicle, victim, offset_m: float, road) -> None:
    """Put `vehicle` on its own lane at the victim's longitudinal position plus `offset_m`, at the victim's speed."""
    lane = road.network.get_lane(vehicle.lane_index)
    s = lane.local_coordinates(victim.position)[0] + offset_m
    import numpy as np

    vehicle.position = np.asarray(lane.position(s, 0.0), dtype=float)
    vehicle.heading = lane.heading_at(s)
    vehicle.speed = float(victim.speed)


def make_base_env(scenario: str | Scenario, overrides: dict[str, Any] | None = None, render: bool = False):
    """The unwrapped highway-env environment of `scenario` with discrete meta-actions."""
    # headless rendering: SDL's "offscreen" driver (highway-env turns its viewer off under "dummy")
    os.environ.setdefault("SDL_VIDEODRIVER", "offscreen")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    import gymnasium as gym
    import highway_env  # noqa: F401  (registers the envs)

    check_versions()
    spec = get_scenario(scenario) if isinstance(scenario, str) else scenario
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env: Any = gym.make(spec.env_id, render_mode="rgb_array" if render else None).unwrapped  # highway-env's
    action = dict(env.config["action"])
    action["type"] = "DiscreteMetaAction"
    action.pop("steering_range", None)
    action.pop("dynamical", None)
    action["longitudinal"], action["lateral"] = True, True
    cfg = {"action": action, **spec.config, **(overrides or {})}
    env.configure(cfg)
    return env
