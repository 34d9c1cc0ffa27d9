"""The expert cut_in reward on hand-made reward states (STATE_API), values worked out by hand."""

from __future__ import annotations

import math

import pytest

from palaestra.aed.rewards import cut_in


def state(
    long,
    lat,
    closing=0.0,
    same_lane=False,
    in_lane_s=0.0,
    accident="",
    crashed_other=0.0,
    on_road=1.0,
    with_adversary=1.0,
):
    return {
        "rel": {"long": long, "lat": lat, "closing_speed": closing, "same_lane": float(same_lane),
                "in_victim_lane_s": in_lane_s, "dist": math.hypot(long, lat)},
        "adv": {"on_road": on_road, "lane_changing": 0.0},
        "event": {"victim_collision": float(bool(accident)), "accident_type": accident,
                  "with_adversary": with_adversary if accident else 0.0, "adv_crashed_other": crashed_other},
    }  # fmt: skip


def test_setup_peaks_at_the_launch_point_beside_and_just_ahead():
    # a neighbouring lane (4 m aside), bumper gap 3 m (centres 8 m apart), the victim closing at 8 m/s or more
    assert cut_in(state(8.0, -4.0, closing=9.0))["setup"] == pytest.approx(0.15)
    assert cut_in(state(8.0, 4.0, closing=0.0))["setup"] == pytest.approx(0.075)  # half while it does not close
    # 10 m further ahead: exp(-1) of it; in the victim's lane 30 m ahead: exp(-(22/10)^2 - (4/3)^2)
    assert cut_in(state(18.0, 4.0, closing=8.0))["setup"] == pytest.approx(0.15 * math.exp(-1.0))
    assert cut_in(state(30.0, 0.0, closing=8.0))["setup"] == pytest.approx(0.15 * math.exp(-4.84 - 16 / 9))


def test_merge_pays_once_on_entering_ahead_more_than_any_step_of_setup():
    entering = cut_in(state(8.0, 0.5, closing=4.0, same_lane=True, in_lane_s=0.4))
    assert entering["merge"] == pytest.approx(2.0 * (1 - 3 / 15) * (0.5 + 0.25)) and entering["setup"] == 0.0
    assert entering["merge"] > 5 * 0.15  # five steps of the best setup
    settled = cut_in(state(8.0, 0.5, closing=4.0, same_lane=True, in_lane_s=1.6))
    assert settled["merge"] == 0.0 and settled["hold"] == pytest.approx(0.1)
    late = cut_in(state(8.0, 0.5, closing=4.0, same_lane=True, in_lane_s=3.2))  # past the cut-in window
    assert late["merge"] == late["hold"] == 0.0
    for long in (4.0, 5.8):  # no gap, or under 1 m: what ends in clipping the victim's front corner
        assert cut_in(state(long, 1.0, closing=4.0, same_lane=True, in_lane_s=0.2))["merge"] == 0.0


@pytest.mark.parametrize(("accident", "bonus"), [("cut_in", 10.0), ("side_swipe", 0.0), ("rear_end", 0.0)])
def test_the_bonus_is_for_a_cut_in_only(accident, bonus):
    assert cut_in(state(5.0, 1.0, same_lane=True, in_lane_s=0.6, accident=accident))["collision"] == bonus
    # the same with other traffic (as in every expert reward: the victim's accident of the type is what counts)
    assert cut_in(state(30.0, 8.0, accident=accident, with_adversary=0.0))["collision"] == bonus


def test_crashing_into_others_or_leaving_the_road_costs():
    assert cut_in(state(30.0, 8.0, crashed_other=1.0))["collision"] == -3.0
    assert cut_in(state(30.0, 8.0, on_road=0.0))["collision"] == -3.0
