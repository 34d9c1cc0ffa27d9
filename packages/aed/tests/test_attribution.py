"""Collision attribution on scripted contacts built directly on a highway-env road (not through AdversaryEnv)."""

from __future__ import annotations

import pytest

from palaestra.aed.attribution import History, classify, step_road
from palaestra.aed.judge import RuleJudge

highway_env = pytest.importorskip("highway_env")


def scripted_road(victim_state, other_state):
    """Two ControlledVehicles on a 2-lane straight road: (lane, x, speed, target_lane) each."""
    from highway_env.road.road import Road, RoadNetwork
    from highway_env.vehicle.controller import ControlledVehicle

    road = Road(RoadNetwork.straight_road_network(lanes=2, length=1000), np_random=None)
    made = []
    for lane, x, speed, target_lane in (victim_state, other_state):
        lane_index = ("0", "1", lane)
        v = ControlledVehicle(
            road,
            road.network.get_lane(lane_index).position(x, 0),
            speed=speed,
            target_lane_index=("0", "1", target_lane),
            target_speed=speed,
        )
        road.vehicles.append(v)
        made.append(v)
    return road, made


def run_until_contact(road, victim, other, max_s=8.0, dt=0.1):
    roles = {id(victim): "victim", id(other): "adv0"}
    history = History(int(1 / dt))
    history.record(0.0, road.vehicles)
    t = 0.0
    while t < max_s:
        records = step_road(road, dt, t, int(t), roles, history)
        t += dt
        if records:
            return records
    raise AssertionError("no contact")


def test_victim_rear_ends_a_settled_slow_vehicle():
    road, (victim, other) = scripted_road((0, 0.0, 25.0, 0), (0, 40.0, 10.0, 0))
    [rec] = run_until_contact(road, victim, other)
    assert (rec.a_role, rec.b_role, rec.striker) == ("victim", "adv0", "victim")
    assert rec.long > 0 and abs(rec.lat) < 1.0 and rec.b_in_a_lane_s >= 1.0
    assert rec.t == pytest.approx((40.0 - 5.0) / 15.0, abs=0.3)  # gap minus one vehicle length at 15 m/s closing
    assert classify(rec, "highway") == "rear_end"
    assert RuleJudge()(rec) is True
    assert victim.crashed and other.crashed


def test_adversary_rams_victim_from_behind():
    road, (victim, other) = scripted_road((0, 30.0, 10.0, 0), (0, 0.0, 28.0, 0))
    [rec] = run_until_contact(road, victim, other)
    assert rec.striker == "adv0" and rec.long < 0
    assert classify(rec, "highway") == "rear_end"
    assert RuleJudge()(rec) is False


def test_adversary_cuts_in_front_of_victim():
    # the adversary changes into the victim's lane 8 m ahead while slower: the victim hits it, but it cut in
    road, (victim, other) = scripted_road((0, 0.0, 25.0, 0), (1, 12.0, 12.0, 0))
    [rec] = run_until_contact(road, victim, other)
    assert rec.long > 0
    assert classify(rec, "highway") in ("cut_in", "side_swipe")
    assert RuleJudge()(rec) is False


def test_side_swipe_by_the_victim_changing_lanes():
    road, (victim, other) = scripted_road((1, 0.0, 20.0, 0), (0, 1.0, 20.0, 0))
    [rec] = run_until_contact(road, victim, other)
    assert abs(rec.lat) >= 1.0 and rec.a_lane_changing and not rec.b_lane_changing
    assert classify(rec, "highway") == "side_swipe"
    assert RuleJudge()(rec) is True
