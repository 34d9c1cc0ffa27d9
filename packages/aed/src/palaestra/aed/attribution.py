"""Collision attribution: who hit whom, when, and the geometry at first contact.

highway-env only sets ``vehicle.crashed``; it never says with whom. The
adversary environment steps the road itself (`step_road`), compares crash
flags before and after every simulation frame, and pairs each newly crashed
vehicle with the road user whose polygon intersects its own (highway-env's
own test, `highway_env.utils.are_polygons_intersecting` on
``Vehicle.polygon()``; the nearest centre only if none does). For each pair it
writes a `CollisionRecord` with the geometry at first contact, seen from the
victim's frame when the victim is involved.

Contact normal: the separating axis (an edge normal of either rectangle) that
the pair crossed last during the frame, from the polygons before the frame and
each vehicle's displacement over it (swept separating-axis test); if they
already overlapped before the frame, highway-env's minimum-translation axis.
The normal is then snapped to the longitudinal or the lateral axis of vehicle
a (the victim whenever it is involved), whichever it is closer to: a vehicle
moving along its heading has no velocity along its own side's normal, so a
swerving car's tilted flank would otherwise never make it the striker.
Striker: the vehicle whose own velocity along that normal moves it more into
the other, ``v_a . n`` against ``v_b . (-n)`` with ``n`` pointing from a to b.
In a rear-end the normal is longitudinal and the follower strikes; in a side
contact it is lateral and the vehicle moving sideways strikes, whichever of
them is ahead (a centre-to-centre direction would blame the faster follower);
at a crossing, the vehicle whose front meets the other's side. The record keeps
that snapped axis (``contact_axis``): ``longitudinal`` when one vehicle's
front met the other's back, ``lateral`` for a side contact.

Classification (`classify`) on roads where traffic shares a direction
(highway, merge's main road) reads the contact axis, not the centre offset:
a side contact is a side-swipe; a front-to-back contact is a cut-in when the
leader entered the follower's lane (or was still entering it: a late cut-in,
its centre up to a lane width aside) less than ``CUT_IN_WINDOW_S`` before
contact while the follower kept its lane, else a rear-end. A threshold on the
lateral offset alone called late cut-ins side-swipes: at highway-env's 5 Hz
frames a contact is recorded after up to a frame of overlap, and a leader
struck from behind while moving over is recorded 1.5-2.3 m aside. A
front-to-back contact also needs the other more ahead (or behind) than aside
(``|long| > |lat|``): near highway-env's steepest lane-change heading (pi/4)
the snapped axis of a front corner driven into a flank is ambiguous.

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
"""A leader that entered the follower's lane less than this long before contact cut in (our choice: the AED
paper defines the type in words, a vehicle changing into the AV's lane just ahead of it, with no number)."""
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
    a_headway_s: float = 99.0
    """a's time headway to b one second before contact (gap / a's speed; 99 when b was not ahead of a)."""
    right_of_way: str = ""
    """Which of a and b had the right of way at a crossing (``a``, ``b``, or ``""`` when equal / not a crossing):
    the higher highway-env lane ``priority``, and in a roundabout the vehicle already on the ring."""
    contact_axis: str = ""
    """Axis of the contact normal in a's frame: ``longitudinal`` (a's front or back met the other), ``lateral``
    (a side contact), ``""`` when unknown (records made before the field existed)."""
    accident_type: str = ""
    """Filled by `classify` (taxonomy in palaestra.aed.rewards)."""
    victim_responsible: bool | None = None
    """Filled by a judge when the victim is involved."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class History:
    """Per-vehicle ring buffer of (t, lane, target lane, speed, position) at every simulation frame."""

    def __init__(self, sim_frequency: int):
        self.dt = 1.0 / sim_frequency
        self.frames: dict[int, deque] = {}
        self.maxlen = int(HISTORY_S * sim_frequency) + 1

    def record(self, t: float, vehicles) -> None:
        for v in vehicles:
            buf = self.frames.setdefault(id(v), deque(maxlen=self.maxlen))
            target = getattr(v, "target_lane_index", v.lane_index)
            buf.append((t, v.lane_index, target, float(v.speed), np.array(v.position, float)))

    def time_in_lane(self, v, lane_index) -> float:
        """Seconds `v` has continuously been on `lane_index` (same road segment and lane id), newest backwards."""
        buf = self.frames.get(id(v), ())
        for n, (_, lane, *_) in enumerate(reversed(buf)):
            if lane != lane_index:
                return max(0, n - 1) * self.dt
        return HISTORY_S  # in that lane for as long as we know (e.g. since the reset): settled

    def changed_lane_within(self, v, seconds: float) -> bool:
        buf = list(self.frames.get(id(v), ()))[-int(seconds / self.dt) - 1 :]
        return any(lane[2] != buf[-1][1][2] or tgt != lane for _, lane, tgt, *_ in buf) if buf else False

    def min_accel(self, v, seconds: float = 1.0) -> float:
        buf = list(self.frames.get(id(v), ()))[-int(seconds / self.dt) - 1 :]
        speeds = [s for _, _, _, s, _ in buf]
        if len(speeds) < 2:
            return 0.0
        return float(min(np.diff(speeds)) / self.dt)

    def headway(self, a, b, seconds: float = 1.0) -> float:
        """a's time headway to b `seconds` before now: bumper gap along a's heading / a's speed (99: b not ahead)."""
        n = int(seconds / self.dt) + 1
        buf_a, buf_b = self.frames.get(id(a), ()), self.frames.get(id(b), ())
        if not buf_a or not buf_b:
            return 99.0
        (_, _, _, speed, pa), (_, _, _, _, pb) = buf_a[max(0, len(buf_a) - n)], buf_b[max(0, len(buf_b) - n)]
        gap = float(np.dot(pb - pa, (math.cos(a.heading), math.sin(a.heading)))) - (a.LENGTH + b.LENGTH) / 2
        return 99.0 if gap < 0 else gap / max(speed, 0.1)


def wrap(angle: float) -> float:
    return (angle + math.pi) % (2 * math.pi) - math.pi


def contact_normal(a_before: np.ndarray, b_before: np.ndarray, da: np.ndarray, db: np.ndarray) -> np.ndarray:
    """Unit normal of first contact, pointing from a to b (swept separating-axis test, module docstring).

    ``a_before``, ``b_before``: closed polygons (``Vehicle.polygon()``) before the frame; ``da``, ``db``: each
    one's displacement over the frame."""
    from highway_env import utils

    best, best_t = None, -np.inf
    for poly in (a_before, b_before):
        for p1, p2 in zip(poly[:-1], poly[1:]):
            n = np.array([p1[1] - p2[1], p2[0] - p1[0]], float)
            n /= np.linalg.norm(n)
            min_a, max_a = utils.project_polygon(a_before, n)
            min_b, max_b = utils.project_polygon(b_before, n)
            closing = float(np.dot(da - db, n))
            if max_a < min_b:  # a below b on this axis: it must move up to touch
                t = (min_b - max_a) / closing if closing > 1e-9 else np.inf
            elif max_b < min_a:
                t = (min_a - max_b) / -closing if closing < -1e-9 else np.inf
            else:
                continue  # already overlapping on this axis
            if np.isfinite(t) and t > best_t:
                best, best_t = n, t
    if best is None:  # overlapping before the frame: highway-env's minimum translation axis
        _, _, translation = utils.are_polygons_intersecting(a_before, b_before, da, db)
        best = -np.asarray(translation, float) if translation is not None else b_before[0] - a_before[0]
        best = best / (np.linalg.norm(best) or 1.0)
    centres = b_before[:-1].mean(axis=0) - a_before[:-1].mean(axis=0)
    return best if np.dot(best, centres) >= 0 else -best


def snap_to_frame(normal: np.ndarray, heading: float) -> np.ndarray:
    """`normal` replaced by the longitudinal or lateral unit axis of a vehicle with `heading` (same sense)."""
    along, across = np.array([math.cos(heading), math.sin(heading)]), np.array([-math.sin(heading), math.cos(heading)])
    axis = along if abs(np.dot(normal, along)) >= abs(np.dot(normal, across)) else across
    return axis if np.dot(axis, normal) >= 0 else -axis


def striker_of(a_velocity, b_velocity, normal: np.ndarray) -> str:
    """``"a"`` or ``"b"``: whose own velocity along the contact normal (a to b) drives it more into the other."""
    return "a" if float(np.dot(a_velocity, normal)) >= float(np.dot(b_velocity, -normal)) else "b"


def right_of_way(a, b) -> str:
    """``a``/``b``: which had the right of way (higher lane priority; on a roundabout, the vehicle on the ring)."""
    ring_a, ring_b = (set(v.lane_index[:2]) <= RING_NODES for v in (a, b))
    if ring_a != ring_b:  # only roundabout lanes join ring nodes
        return "a" if ring_a else "b"
    pa, pb = (getattr(v.road.network.get_lane(v.lane_index), "priority", 0) for v in (a, b))
    return "" if pa == pb else ("a" if pa > pb else "b")


def relative(a, b) -> tuple[float, float]:
    """Position of b in a's frame: (longitudinal, lateral)."""
    d = np.asarray(b.position) - np.asarray(a.position)
    c, s = math.cos(a.heading), math.sin(a.heading)
    return float(d[0] * c + d[1] * s), float(-d[0] * s + d[1] * c)


def make_record(
    a, b, a_role: str, b_role: str, t: float, step: int, history: History, normal: np.ndarray | None = None
) -> CollisionRecord:
    """The record of a contact between a and b; ``normal`` (a to b) from `contact_normal`, default centre to
    centre (for would-be contacts, e.g. the preference model's dense reward)."""
    long, lat = relative(a, b)
    b_vehicle = hasattr(b, "lane_index") and b_role != "object"
    if normal is None:
        d = np.asarray(b.position, float) - np.asarray(a.position, float)
        normal = d / (np.linalg.norm(d) or 1.0)
    b_velocity = getattr(b, "velocity", np.zeros(2))
    along = np.array([math.cos(a.heading), math.sin(a.heading)])
    longitudinal = abs(float(np.dot(snap_to_frame(normal, float(a.heading)), along))) > 0.5
    striker = a_role if not b_vehicle or striker_of(a.velocity, b_velocity, normal) == "a" else b_role
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
        a_headway_s=history.headway(a, b) if b_vehicle else 99.0,
        right_of_way=right_of_way(a, b) if b_vehicle else "",
        contact_axis="longitudinal" if longitudinal else "lateral",
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
    if crossing and (scenario == "intersection" or not rec.contact_axis):
        return "intersection_crossing" if scenario == "intersection" else "side_swipe"
    if not rec.contact_axis:  # older records: the centre offset stands in for the contact axis
        front_to_back = abs(rec.lat) < LONGITUDINAL_LAT_M
    else:  # lane changes tilt a vehicle up to ~0.8 rad at low speed: the axis decides, not the heading
        front_to_back = rec.contact_axis == "longitudinal" and abs(rec.long) > abs(rec.lat)
    if not front_to_back:
        return "side_swipe"
    return "cut_in" if leader_cut_in(rec) else "rear_end"


def leader_cut_in(rec: CollisionRecord) -> bool:
    """Whether the leader of a front-to-back contact entered the follower's lane less than `CUT_IN_WINDOW_S`
    before it, or was still entering it, while the follower kept its lane (module docstring)."""
    if rec.long > 0:  # b leads
        in_lane_s, leader_moving, follower_moving = rec.b_in_a_lane_s, rec.b_lane_changing, rec.a_lane_changing
    else:
        in_lane_s, leader_moving, follower_moving = rec.a_in_b_lane_s, rec.a_lane_changing, rec.b_lane_changing
    if rec.a_lane == rec.b_lane:  # the leader's lane index already switched: how long ago
        return in_lane_s < CUT_IN_WINDOW_S
    # not yet in the follower's lane, yet its back met the follower's front: it was moving over (a late cut-in),
    # unless the follower was the one changing lanes (it ran into a leader settled in the lane it entered)
    return leader_moving and not follower_moving


def step_road(road, dt: float, t: float, step: int, roles: dict[int, str], history: History) -> list[CollisionRecord]:
    """One simulation frame of ``road`` (as ``Road.act(); Road.step(dt)``) returning its new contacts."""
    before = {id(v): v.crashed for v in road.vehicles}
    polygons = {id(o): (o.polygon(), np.array(o.position, float)) for o in [*road.vehicles, *road.objects]}
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
        partner = contact_partner(v, others)
        paired.update({id(v), id(partner)})
        v_role = roles.get(id(v), "npc")
        p_role = roles.get(id(partner), "npc" if partner in road.vehicles else "object")
        a, b, a_role, b_role = v, partner, v_role, p_role
        if p_role == "victim" or (p_role.startswith("adv") and v_role == "npc"):
            a, b, a_role, b_role = partner, v, p_role, v_role
        records.append(make_record(a, b, a_role, b_role, t + dt, step, history, _normal(a, b, polygons)))
    return records


def contact_partner(v, others):
    """The road user whose polygon intersects v's (the deepest overlap if several); else the nearest centre."""
    from highway_env import utils

    touching = []
    for o in others:
        hit, _, translation = utils.are_polygons_intersecting(v.polygon(), o.polygon(), np.zeros(2), np.zeros(2))
        if hit:
            touching.append((float(np.linalg.norm(translation)) if translation is not None else 0.0, o))
    if touching:
        return max(touching, key=lambda pair: pair[0])[1]
    return min(others, key=lambda o: float(np.linalg.norm(np.asarray(o.position) - v.position)))


def _normal(a, b, polygons: dict) -> np.ndarray | None:
    if id(a) not in polygons or id(b) not in polygons:
        return None
    (pa, ca), (pb, cb) = polygons[id(a)], polygons[id(b)]
    normal = contact_normal(pa, pb, np.asarray(a.position) - ca, np.asarray(b.position) - cb)
    return snap_to_frame(normal, float(a.heading))
