"""The Bradley-Terry model learns the judge's notion of AV responsibility from judge-labelled pairs."""

from __future__ import annotations

import math
import random

from palaestra.aed.attribution import CollisionRecord
from palaestra.aed.env import accident_features
from palaestra.aed.judge import RuleJudge
from palaestra.aed.preference import PreferenceModel, label_accidents


def random_accidents(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        behind = rng.random() < 0.3
        side = rng.random() < 0.3
        rec = CollisionRecord(
            t=5.0,
            step=5,
            a_role="victim",
            b_role="adv0",
            striker="adv0" if behind else rng.choice(["victim", "adv0"]),
            long=-5.0 if behind else rng.uniform(0.5, 5.0),
            lat=rng.uniform(1.6, 2.5) if side else rng.uniform(-1, 1),
            heading_diff=rng.uniform(-0.2, 0.2),
            a_speed=rng.uniform(15, 30),
            b_speed=rng.uniform(5, 30),
            a_lane="0-1-1",
            b_lane="0-1-1",
            a_lane_changing=side and rng.random() < 0.5,
            b_lane_changing=side and rng.random() < 0.5,
            b_in_a_lane_s=rng.choice([0.2, 0.6, 1.5, 4.0]),
            a_in_b_lane_s=4.0,
            b_min_accel=rng.choice([-1.0, -3.0, -8.0]),
            a_min_accel=-1.0,
        )
        rec.victim_responsible = RuleJudge()(rec)
        state = {"rel": {"long": rec.long, "lat": rec.lat, "closing_speed": rec.a_speed - rec.b_speed}}
        out.append({**rec.to_dict(), "features": accident_features(rec, [state])})
    return out


def test_bradley_terry_agrees_with_the_judge_on_held_out_accidents():
    train, test = random_accidents(300, 0), random_accidents(200, 1)
    labels = label_accidents(train)
    assert 0.2 < sum(labels) / len(labels) < 0.8
    model = PreferenceModel(len(train[0]["features"]), seed=0)
    fit = model.fit([a["features"] for a in train], labels, epochs=300)
    assert fit["pairs"] > 1000 and fit["pair_accuracy"] > 0.9
    agree = sum(model.is_effective(a) == a["victim_responsible"] for a in test) / len(test)
    assert agree >= 0.9, agree
    restored = PreferenceModel.from_dict(model.to_dict())
    assert all(restored.is_effective(a) == model.is_effective(a) for a in test[:20])
    assert math.isfinite(fit["bt_loss"])


def test_labels_from_another_judge():
    accidents = random_accidents(10, 2)
    flipped = label_accidents(accidents, judge=lambda rec: not RuleJudge()(rec))
    assert flipped == [not a["victim_responsible"] for a in accidents]


def test_summary_intervals_are_wilson_intervals():
    from palaestra.aed.evaluation import summarize
    from palaestra.shared.stats import wilson_interval as wilson

    acc = [{"accident_type": "rear_end", "victim_responsible": r} for r in (True, False, False, False)]
    s = summarize(acc, episodes=10)
    assert s["responsible_rate"] == 0.25 and s["effective_asr"] == 0.1 and s["asr"] == 0.4
    assert s["responsible_rate_ci"] == wilson(1, 4) and s["effective_asr_ci"] == wilson(1, 10)


def test_relabel_replay_rewrites_only_recorded_accident_slots():
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.buffers import ReplayBuffer

    from palaestra.aed.preference import relabel_replay

    space = gym.spaces.Box(-1, 1, (2,), np.float32)
    buffer = ReplayBuffer(8, space, gym.spaces.Discrete(2), device="cpu")
    for r in (0.2, 10.0, 0.1, 3.0, 10.0):
        buffer.add(np.zeros(2), np.zeros(2), np.array([0]), np.array([r]), np.array([False]), [{}])

    class Model:
        replay_buffer = buffer

    accidents = [{"ok": True}, {"ok": False}, {"ok": False}, {"ok": True}]
    slots = [(1, 0), (3, 0), None, (6, 0)]  # slot 6 is past the buffer's position: not written yet, left alone
    done = relabel_replay(Model(), accidents, slots, lambda a: a["ok"], bonus=5.0, penalty=2.0)
    assert done == {"relabelled": 2, "relabelled_effective": 1}
    # effective: old reward + bonus; ineffective: nothing (min(r, 0)) minus the penalty; others untouched
    assert np.allclose(buffer.rewards[:5, 0], [0.2, 15.0, 0.1, -2.0, 10.0])
    buffer.full = True  # wrapped around: the slots may hold newer transitions
    assert relabel_replay(Model(), accidents, slots, lambda a: True, 5.0, 2.0)["relabelled"] == 0
