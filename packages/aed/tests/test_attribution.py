"""Collision attribution on scripted contacts built directly on a highway-env road (not through AdversaryEnv)."""

from __future__ import annotations

import math

import numpy as np
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


# -- synthetic geometry: plain kinematic vehicles keep their heading and speed, so each contact is known exactly --


def straight_vehicles(*states):
    """(x, y, heading, speed) each on a 2-lane straight road (lanes at y = 0 and y = 4; y grows to the right)."""
    from highway_env.road.road import Road, RoadNetwork
    from highway_env.vehicle.kinematics import Vehicle

    road = Road(RoadNetwork.straight_road_network(lanes=2, length=1000), np_random=None)
    for x, y, heading, speed in states:
        road.vehicles.append(Vehicle(road, [x, y], heading, speed))
    return road, road.vehicles


def first_contact(road, dt=0.05, max_s=5.0):
    victim, other = road.vehicles[:2]
    return run_until_contact(road, victim, other, max_s=max_s, dt=dt)[0]


def test_rear_end_striker_is_the_follower():
    road, _ = straight_vehicles((0.0, 0.0, 0.0, 25.0), (20.0, 0.0, 0.0, 10.0))
    rec = first_contact(road)
    assert rec.striker == "victim" and rec.long > 0 and classify(rec, "highway") == "rear_end"


@pytest.mark.parametrize("ahead", [3.0, -3.0])
def test_side_swipe_striker_is_the_swerving_vehicle_ahead_or_behind(ahead):
    # the adversary in the left lane, overlapping the victim, heads 0.25 rad into it; the victim drives straight
    # and is the faster when the adversary is ahead: a centre-to-centre rule would call the victim the striker
    road, _ = straight_vehicles((0.0, 4.0, 0.0, 20.0), (ahead, 0.4, 0.25, 20.0 if ahead > 0 else 22.0))
    rec = first_contact(road)
    assert rec.striker == "adv0", rec
    assert abs(rec.lat) > 1.0 and classify(rec, "highway") == "side_swipe"


def test_centre_to_centre_would_have_blamed_the_victim():
    # the same side-swipe from ahead, judged by the old rule (velocity along the centre-to-centre line)
    road, (victim, adv) = straight_vehicles((0.0, 4.0, 0.0, 20.0), (3.0, 0.4, 0.25, 20.0))
    first_contact(road)
    d = adv.position - victim.position
    d = d / np.linalg.norm(d)
    assert np.dot(victim.velocity, d) > np.dot(adv.velocity, -d)  # the old striker: victim


def test_cut_in_the_victim_strikes_the_rear_of_the_vehicle_that_cut_in():
    # the adversary crosses into the victim's lane 12 m ahead and slower: the victim's front hits its back
    road, _ = straight_vehicles((0.0, 4.0, 0.0, 25.0), (12.0, 0.5, 0.35, 14.0))
    rec = first_contact(road)
    assert rec.striker == "victim" and rec.long > 0
    assert rec.b_in_a_lane_s < 3.0 and classify(rec, "highway") == "cut_in"
    assert RuleJudge()(rec) is False  # rule 3: the lead cut in


def test_partner_is_the_vehicle_whose_polygon_touches_not_the_nearest_centre():
    from palaestra.aed.attribution import contact_partner

    road, (v, near, touching) = straight_vehicles((0.0, 0.0, 0.0, 0.0), (5.1, 0.0, 0.0, 0.0), (4.8, 1.9, 0.0, 0.0))
    assert np.linalg.norm(near.position - v.position) < np.linalg.norm(touching.position - v.position)
    assert contact_partner(v, [near, touching]) is touching


def test_t_bone_at_a_crossing_the_crossing_vehicle_strikes_and_the_victim_had_to_yield():
    from highway_env.vehicle.kinematics import Vehicle

    from palaestra.aed.scenarios import make_base_env

    env = make_base_env("intersection")
    env.reset(seed=0)
    road = env.road
    major, minor = road.network.get_lane(("ir1", "il3", 0)), road.network.get_lane(("ir0", "il2", 0))
    assert minor.priority < major.priority
    grid = np.linspace(0, minor.length, 400)
    s_minor, s_major = min(
        ((a, b) for a in grid for b in np.linspace(0, major.length, 400)),
        key=lambda ab: np.linalg.norm(minor.position(ab[0], 0) - major.position(ab[1], 0)),
    )
    # victim (minor road, 5 m/s) reaches the crossing point at t = 0.5 s, when the major-road car's front
    # (12 m/s, 2.5 m half length) reaches the victim's side (1 m half width)
    victim = Vehicle(road, minor.position(s_minor - 2.5, 0), minor.heading_at(s_minor), 5.0)
    other = Vehicle(road, major.position(s_major - 6.0 - 3.5, 0), major.heading_at(s_major), 12.0)
    road.vehicles = [victim, other]
    rec = first_contact(road, dt=0.05)
    assert rec.striker == "adv0" and abs(abs(rec.heading_diff) - math.pi / 2) < 0.1
    assert rec.right_of_way == "b" and classify(rec, "intersection") == "intersection_crossing"
    assert RuleJudge().explain(rec) == (True, "2: crossing conflict, the victim had to yield")
    env.close()


def frames_until_contact(road, dt):
    """Step `road` frame by frame (as `step_road` does); the polygons before the contact frame and the record."""
    victim, other = road.vehicles[:2]
    roles = {id(victim): "victim", id(other): "adv0"}
    history = History(int(round(1 / dt)))
    history.record(0.0, road.vehicles)
    t = 0.0
    for _ in range(int(5.0 / dt)):
        before = victim.polygon(), other.polygon()
        records = step_road(road, dt, t, int(t), roles, history)
        t += dt
        if records:
            return before, records[0]
    raise AssertionError("no contact")


def test_late_cut_in_recorded_beside_the_lane_centre_is_still_a_cut_in():
    # highway-fast's 5 Hz frames: the adversary moving over (0.2 rad) 10 m ahead and slower is struck from behind,
    # but the record (after the frame's overlap) puts it more than 1.5 m aside: the centre-offset rule said side-swipe
    road, (victim, adv) = straight_vehicles((0.0, 4.0, 0.0, 25.0), (10.0, 0.5, 0.2, 18.0))
    adv.target_lane_index = ("0", "1", 1)  # what a ControlledVehicle moving over would carry
    (victim_before, adv_before), rec = frames_until_contact(road, dt=0.2)
    # independent check of the contact axis: before the frame the two overlapped across the victim's heading
    # (lateral projections intersect) but not along it (the adversary's back was still ahead of the victim's front)
    xs_v, ys_v, xs_a, ys_a = victim_before[:, 0], victim_before[:, 1], adv_before[:, 0], adv_before[:, 1]
    assert xs_a.min() > xs_v.max() and ys_a.max() > ys_v.min()
    assert rec.contact_axis == "longitudinal" and rec.striker == "victim" and rec.long > 0
    assert abs(rec.lat) >= 1.5  # beyond the old rule's lateral threshold
    assert rec.b_in_a_lane_s < 3.0 and classify(rec, "highway") == "cut_in"


def test_adversary_clipping_the_victim_front_while_moving_over_is_a_side_swipe():
    # the adversary moves over only 3 m ahead: its flank meets the victim's front corner (it strikes, sideways)
    road, (victim, adv) = straight_vehicles((0.0, 4.0, 0.0, 25.0), (3.0, 0.4, 0.25, 25.0))
    adv.target_lane_index = ("0", "1", 1)
    (victim_before, adv_before), rec = frames_until_contact(road, dt=0.2)
    assert adv_before[:, 0].min() < victim_before[:, 0].max()  # overlapping along the heading before the frame
    assert rec.contact_axis == "lateral" and rec.striker == "adv0"
    assert classify(rec, "highway") == "side_swipe"


def test_follower_changing_lanes_into_the_back_of_a_settled_leader_is_a_rear_end_not_a_cut_in():
    road, (victim, lead) = straight_vehicles((0.0, 0.0, 0.25, 25.0), (12.0, 4.0, 0.0, 12.0))
    victim.target_lane_index = ("0", "1", 1)
    _, rec = frames_until_contact(road, dt=0.2)
    assert rec.contact_axis == "longitudinal" and rec.striker == "victim" and rec.long > 0
    assert rec.b_in_a_lane_s >= 3.0  # the leader was in that lane all along: the victim is the one who moved
    assert classify(rec, "highway") == "rear_end"
