"""The adversary env: pinned scenario ids, takeover after every reset, SB3's check_env, accident bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest

from palaestra.aed.env import AdversaryEnv
from palaestra.aed.scenarios import SCENARIOS, get_scenario


def test_scenario_ids_are_pinned_and_registered():
    import gymnasium as gym
    import highway_env  # noqa: F401

    assert {s.env_id for s in SCENARIOS.values()} == {"highway-fast-v0", "merge-v1", "roundabout-v1", "intersection-v2"}
    for spec in SCENARIOS.values():
        assert spec.env_id in gym.registry
    with pytest.raises(ValueError, match="did you mean 'highway'"):
        get_scenario("higway")


@pytest.mark.parametrize("n_adv", [1, 2])
def test_check_env_accepts_it(n_adv):
    from stable_baselines3.common.env_checker import check_env

    env = AdversaryEnv("highway", "rear_end", num_adversaries=n_adv, overrides={"vehicles_count": 8}, max_steps=5)
    check_env(env, warn=False)
    assert env.observation_space.shape == (n_adv * 34,)  # own 6 (incl. time in victim lane, braking), victim 8, 4 x 5


def test_takeover_is_redone_after_every_reset():
    from highway_env.vehicle.behavior import IDMVehicle
    from highway_env.vehicle.controller import MDPVehicle

    env = AdversaryEnv("highway", "cut_in", num_adversaries=2, overrides={"vehicles_count": 8}, max_steps=3)
    for seed in (0, 1):
        env.reset(seed=seed)
        road = env.base.road.vehicles
        assert type(env.victim) is IDMVehicle and env.victim in road
        assert all(type(a) is MDPVehicle and a in road for a in env.advs)
        # the adversaries are the NPCs nearest to the victim
        others = [v for v in road if v is not env.victim and v not in env.advs]
        far = max(np.linalg.norm(a.position - env.victim.position) for a in env.advs)
        assert all(np.linalg.norm(o.position - env.victim.position) >= far - 1e-6 for o in others)


@pytest.mark.parametrize("scenario", ["merge", "roundabout", "intersection"])
def test_other_scenarios_step(scenario):
    env = AdversaryEnv(scenario, "rear_end", max_steps=3)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    for _ in range(3):
        obs, reward, term, trunc, info = env.step(env.action_space.sample())
        assert np.isfinite(reward)
        if term or trunc:
            break
    assert "attack" in info


def drive_into_victim(env):
    """Scripted adversary: change lanes toward the victim, match its longitudinal position; until an accident."""
    for seed in range(40):
        env.reset(seed=seed)
        done = False
        while not done:
            rel = env.state(0, env._event([], []))["rel"]
            action = (0 if rel["lat"] > 0 else 2) if abs(rel["lat"]) > 2 else (3 if rel["long"] < 0 else 4)
            _, reward, term, trunc, info = env.step(action)
            done = term or trunc
        if info["attack"]["victim_collision"]:
            return reward, term, info
    raise AssertionError("no accident in 40 episodes")


def test_a_victim_collision_is_recorded_once_with_geometry():
    env = AdversaryEnv("highway", "rear_end", overrides={"vehicles_count": 8}, max_steps=30)
    _, term, info = drive_into_victim(env)
    acc = info["attack"]["accident"]
    assert term and acc["a_role"] == "victim"
    assert acc["accident_type"] in ("rear_end", "cut_in", "side_swipe")
    assert isinstance(acc["victim_responsible"], bool) and len(acc["features"]) == 16
    assert sum(1 for r in env.records if r.a_role == "victim") >= 1


@pytest.mark.parametrize("effective", [True, False])
def test_preference_filter_pays_only_effective_accidents(effective):
    env = AdversaryEnv("highway", "rear_end", overrides={"vehicles_count": 8}, accident_filter=lambda acc: effective,
                       effective_bonus=100.0)  # fmt: skip
    reward, _, info = drive_into_victim(env)
    if effective:
        assert reward > 100.0 and "filtered" not in info["accident"]
    else:
        assert reward <= 0.0 and info["accident"]["filtered"]


def test_passive_adversaries_keep_their_lane_and_target_speed():
    from palaestra.aed.evaluation import IdlePolicy

    env = AdversaryEnv("highway", "rear_end", num_adversaries=2, overrides={"vehicles_count": 8}, max_steps=4)
    obs, _ = env.reset(seed=3)
    lanes = [a.target_lane_index for a in env.advs]
    speeds = [a.target_speed for a in env.advs]
    policy = IdlePolicy(2)
    for _ in range(4):
        action, _ = policy.predict(obs)
        obs, _, term, trunc, _ = env.step(action)
        if term or trunc:
            break
    assert [a.target_lane_index for a in env.advs] == lanes and [a.target_speed for a in env.advs] == speeds


def test_reward_state_says_how_long_the_adversary_has_been_in_the_victim_lane():
    # scripted: move into the victim's lane, then keep it; the clock is the policy step (1 s = 5 frames on
    # highway-fast), counted from the first frame in the lane
    env = AdversaryEnv("highway", "cut_in", overrides={"vehicles_count": 8}, max_steps=8)
    checked = 0
    for seed in range(20):
        env.reset(seed=seed)
        seen = []
        for _ in range(6):
            rel = env.state(0, env._event([], []))["rel"]
            action = 1 if rel["same_lane"] else (0 if rel["lat"] > 0 else 2)  # LANE_LEFT/RIGHT toward it, then IDLE
            _, _, term, trunc, _ = env.step(action)
            rel = env.state(0, env._event([], []))["rel"]
            seen.append((rel["same_lane"], rel["in_victim_lane_s"], env.victim.lane_index))
            if term or trunc:
                break
        for (same0, s0, lane0), (same1, s1, lane1) in zip(seen, seen[1:]):
            assert s1 == 0.0 if not same1 else 0.0 <= s1 <= 4.0
            if same1 and not same0 and lane1 == lane0:  # entered during this step
                assert s1 < 1.0
                checked += 1
            if same0 and same1 and lane1 == lane0:  # one more second in the same lane, up to the 4 s of history
                assert s1 == pytest.approx(min(s0 + 1.0, 4.0), abs=1e-6)
                checked += 1
    assert checked >= 3


def _merging_policy(env) -> int:
    """A scripted adversary for the merge: keep level with the victim, and move left out of the merging lane while
    beside it (what an adversary trained for merge_conflict must find)."""
    adv, victim = env.advs[0], env.victim
    dx = adv.position[0] - victim.position[0]
    if adv.lane_index == ("b", "c", 2) and abs(dx) < 8:
        return 0  # LANE_LEFT
    if adv.lane_index[:2] == ("b", "c") and adv.lane_index[2] < 2:
        return 1
    return 4 if dx > 1 else 3 if dx < -1 else 1  # SLOWER / FASTER / IDLE


def test_scenario_placement_puts_the_merge_adversary_on_the_ramp_beside_the_victim():
    from palaestra.aed.env import AdversaryEnv

    nearest = AdversaryEnv("merge", "merge_conflict")
    nearest.reset(seed=7)
    assert nearest.advs[0].lane_index[:2] == ("a", "b")  # a main-road car: it can never be on the ramp
    nearest.close()
    env = AdversaryEnv("merge", "merge_conflict", placement="scenario")
    env.reset(seed=7)
    adv, victim = env.advs[0], env.victim
    assert adv.lane_index == ("j", "k", 0)  # the ramp car (highway-env starts it 80 m ahead at x = 110)
    assert adv.position[0] - victim.position[0] == pytest.approx(5.0, abs=0.5)
    assert adv.speed == pytest.approx(victim.speed)
    done = False
    while not done:
        _, _, term, trunc, info = env.step(_merging_policy(env))
        done = term or trunc
    assert info["attack"]["accident_type"] == "merge_conflict"  # in reach now
    env.close()


def test_an_intersection_reset_does_not_change_the_idm_of_later_scenarios():
    """highway-env's intersection-v2 sets IDMVehicle.DISTANCE_WANTED/COMFORT_ACC_* on the class at every reset;
    an IDM victim of any scenario simulated later in the same process (a Ray worker) inherited them."""
    from highway_env.vehicle.behavior import IDMVehicle

    from palaestra.aed.env import AdversaryEnv

    crossing = AdversaryEnv("intersection", "intersection_crossing", max_steps=2)
    crossing.reset(seed=0)
    assert IDMVehicle.COMFORT_ACC_MIN == -3  # intersection's own values while it runs
    crossing.close()
    env = AdversaryEnv("highway", "rear_end", overrides={"vehicles_count": 6})
    env.reset(seed=0)
    assert (IDMVehicle.DISTANCE_WANTED, IDMVehicle.COMFORT_ACC_MAX, IDMVehicle.COMFORT_ACC_MIN) == (10.0, 3.0, -5.0)
    assert env.victim.COMFORT_ACC_MIN == -5.0
    env.close()
