"""Collision attribution: who hit whom, when, and the geometry at first contact.

highway-env only sets ``vehicle.crashed``; it never says with whom. The
adversary environment steps the road itself (`step_road`), compares crash
flags before and after every simulation frame, and pairs each newly crashed
vehicle with the nearest other vehicle (or road object) in contact. For each
pair it writes a `CollisionRecord` with the geometry at first contact, seen
from the victim's frame when the victim is involved.

Striker: the vehicle whose velocity closes the gap more, i.e. the larger of
``v_i . (p_j - p_i) / |p_j - p_i|``; in a rear-end that is the follower, in a
lane-change side contact the vehicle moving sideways.

`History` keeps the last few seconds of every vehicle (lane, target lane,
speed) so that a judge can ask how long a vehicle had been in a lane and how
hard it braked before contact.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

HISTORY_S = 4.0
CROSSING_RAD = 0.5
"""Heading difference (rad, about 29 degrees) above which a contact is a crossing conflict."""
LONGITUDINAL_LAT_M = 1.5
"""Lateral offset (m) below which a same-direction contact is longitudinal (rear-end / cut-in)."""
CUT_IN_WINDOW_S = 3.0
"""A leader that entered the follower's lane less than this long before contact cut in."""
MERGE_LANES = {("j", "k"), ("k", "b")}
RING_NODES = {"se", "ex", "ee", "nx", "ne", "wx", "we", "sx"}


def lane_str(lane_index) -> str:
    return "-".join(str(p) for p in lane_index) if lane_index else ""


@dataclass
class CollisionRecord:
    """One first contact between two road users (`a` is the victim whenever the victim is involved)."""

    t: float
    """Seconds since reset."""
    step: int
    """Policy step of the contact."""
    a_role: str
    """victim | adv<i> | npc."""
    b_role: str
    """victim | adv<i> | npc | object."""
    striker: str
    """Role of the vehicle that hit the other (see module docstring)."""
    long: float
    """Longitudinal offset of b in a's frame (m, + ahead)."""
    lat: float
    """Lateral offset of b in a's frame (m, + to a's right-hand lanes in highway-env's y-down frame)."""
    heading_diff: float
    """Heading of b minus heading of a, wrapped to [-pi, pi]."""
    a_speed: float
    b_speed: float
    a_lane: str
    b_lane: str
    a_lane_changing: bool
    """a's target lane differed from its lane at contact, or a changed lane in the last second."""
    b_lane_changing: bool
    b_in_a_lane_s: float
    """How long b had been in a's current lane before contact (s, up to the history length)."""
    a_in_b_lane_s: float
    b_min_accel: float
    """Hardest acceleration (most negative, m/s^2) of b over the last second."""
    a_min_accel: float
    accident_type: str = ""
    """Filled by `classify` (taxonomy in palaestra.aed.rewards)."""
    victim_responsible: bool | None = None
    """Filled by a judge when the victim is involved."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class History:
    """Per-vehicle ring buffer of (t, lane, target lane, speed) at every simulation frame."""

    def __init__(self, sim_frequency: int):
        self.dt = 1.0 / sim_frequency
        self.frames: dict[int, deque] = {}
        self.maxlen = int(HISTORY_S * sim_frequency) + 1

    def record(self, t: float, vehicles) -> None:
        for v in vehicles:
            buf = self.frames.setdefault(id(v), deque(maxlen=self.maxlen))
            buf.append((t, v.lane_index, getattr(v, "target_lane_index", v.lane_index), float(v.speed)))

    def time_in_lane(self, v, lane_index) -> float:
        """Seconds `v` has continuously been on `lane_index` (same road segment and lane id), newest backwards."""
        buf = self.frames.get(id(v), ())
        for n, (_, lane, _, _) in enumerate(reversed(buf)):
            if lane != lane_index:
                return max(0, n - 1) * self.dt
        return HISTORY_S  # in that lane for as long as we know (e.g. since the reset): settled

    def changed_lane_within(self, v, seconds: float) -> bool:
        buf = list(self.frames.get(id(v), ()))[-int(seconds / self.dt) - 1 :]
        return any(lane[2] != buf[-1][1][2] or tgt != lane for _, lane, tgt, _ in buf) if buf else False

    def min_accel(self, v, seconds: float = 1.0) -> float:
        buf = list(self.frames.get(id(v), ()))[-int(seconds / self.dt) - 1 :]
        speeds = [s for _, _, _, s in buf]
        if len(speeds) < 2:
            return 0.0
        return float(min(np.diff(speeds)) / self.dt)


def wrap(angle: float) -> float:
    return (angle + math.pi) % (2 * math.pi) - math.pi


def closing_speed(v, other) -> float:
    d = np.asarray(other.position) - np.asarray(v.position)
    norm = float(np.linalg.norm(d)) or 1e-6
    return float(np.dot(v.velocity, d) / norm)


def relative(a, b) -> tuple[float, float]:
    """Position of b in a's frame: (longitudinal, lateral)."""
    d = np.asarray(b.position) - np.asarray(a.position)
    c, s = math.cos(a.heading), math.sin(a.heading)
    return float(d[0] * c + d[1] * s), float(-d[0] * s + d[1] * c)


def make_record(a, b, a_role: str, b_role: str, t: float, step: int, history: History) -> CollisionRecord:
    long, lat = relative(a, b)
    b_vehicle = hasattr(b, "lane_index") and b_role != "object"
    striker = a_role if not b_vehicle or closing_speed(a, b) >= closing_speed(b, a) else b_role
    a_changing = getattr(a, "target_lane_index", a.lane_index) != a.lane_index or history.changed_lane_within(a, 1.0)
    b_changing = b_vehicle and (
        getattr(b, "target_lane_index", b.lane_index) != b.lane_index or history.changed_lane_within(b, 1.0)
    )
    return CollisionRecord(
        t=round(t, 3),
        step=step,
        a_role=a_role,
        b_role=b_role,
        striker=striker,
        long=long,
        lat=lat,
        heading_diff=wrap(float(b.heading) - float(a.heading)),
        a_speed=float(a.speed),
        b_speed=float(getattr(b, "speed", 0.0)),
        a_lane=lane_str(a.lane_index),
        b_lane=lane_str(getattr(b, "lane_index", None)),
        a_lane_changing=bool(a_changing),
        b_lane_changing=bool(b_changing),
        b_in_a_lane_s=history.time_in_lane(b, a.lane_index) if b_vehicle else HISTORY_S,
        a_in_b_lane_s=history.time_in_lane(a, b.lane_index) if b_vehicle else HISTORY_S,
        b_min_accel=history.min_accel(b) if b_vehicle else 0.0,
        a_min_accel=history.min_accel(a),
    )


def classify(rec: CollisionRecord, scenario: str) -> str:
    """Accident type of a contact, from its geometry and the scenario (the default taxonomy)."""
    if rec.b_role == "object":
        return "obstacle"
    crossing = abs(rec.heading_diff) > CROSSING_RAD
    lanes = [tuple(rec.a_lane.split("-")[:2]), tuple(rec.b_lane.split("-")[:2])]
    if scenario == "merge" and (any(seg in MERGE_LANES for seg in lanes) or "b-c-2" in (rec.a_lane, rec.b_lane)):
        return "merge_conflict"
    if scenario == "roundabout" and (crossing or not all(set(seg) <= RING_NODES for seg in lanes)):
        return "roundabout_entry"
    if crossing:
        return "intersection_crossing" if scenario == "intersection" else "side_swipe"
    if abs(rec.lat) < LONGITUDINAL_LAT_M:
        leader_in_lane_s = rec.b_in_a_lane_s if rec.long > 0 else rec.a_in_b_lane_s
        return "cut_in" if leader_in_lane_s < CUT_IN_WINDOW_S else "rear_end"
    return "side_swipe"


def step_road(road, dt: float, t: float, step: int, roles: dict[int, str], history: History) -> list[CollisionRecord]:
    """One simulation frame of ``road`` (as ``Road.act(); Road.step(dt)``) returning its new contacts."""
    before = {id(v): v.crashed for v in road.vehicles}
    road.act()
    road.step(dt)
    history.record(t + dt, road.vehicles)
    records: list[CollisionRecord] = []
    paired: set[int] = set()
    fresh = [v for v in road.vehicles if v.crashed and not before.get(id(v), False)]
    for v in fresh:
        if id(v) in paired:
            continue
        others = [o for o in road.vehicles if o is not v] + list(road.objects)
        if not others:
            continue
        partner = min(others, key=lambda o: float(np.linalg.norm(np.asarray(o.position) - v.position)))
        paired.update({id(v), id(partner)})
        v_role = roles.get(id(v), "npc")
        p_role = roles.get(id(partner), "npc" if partner in road.vehicles else "object")
        a, b, a_role, b_role = v, partner, v_role, p_role
        if p_role == "victim" or (p_role.startswith("adv") and v_role == "npc"):
            a, b, a_role, b_role = partner, v, p_role, v_role
        records.append(make_record(a, b, a_role, b_role, t + dt, step, history))
    return records
