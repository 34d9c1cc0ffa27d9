"""The Bradley-Terry model learns the judge's notion of AV responsibility from judge-labelled pairs."""

from __future__ import annotations

import math
import random

import pytest

from palaestra.aed.attribution import CollisionRecord
from palaestra.aed.judge import RuleJudge
from palaestra.aed.preference import (
    PreferenceModel,
    accident_features,
    compare_pairs,
    label_accidents,
    split_pairs,
)


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
            a_headway_s=rng.uniform(0.3, 3.0),
        )
        rec.victim_responsible = RuleJudge()(rec)
        state = {"rel": {"long": rec.long, "lat": rec.lat, "closing_speed": rec.a_speed - rec.b_speed}}
        out.append({**rec.to_dict(), "features": accident_features(rec, [state])})
    return out


def test_bradley_terry_learns_the_judged_pairs_and_generalizes_to_held_out_accidents():
    accidents = random_accidents(400, 0)
    pairs = compare_pairs(accidents, max_pairs=3000, seed=0)
    scores = [RuleJudge().score(_record(a)) for a in accidents]
    assert all(scores[i] > scores[j] for i, j in pairs)  # ordered by the graded score
    train_idx, train_pairs, test_pairs = split_pairs(len(accidents), pairs, holdout=0.25, seed=0)
    held_out = set(range(len(accidents))) - set(train_idx)
    assert len(held_out) == 100 and all(i in held_out and j in held_out for i, j in test_pairs)
    assert not any(i in held_out or j in held_out for i, j in train_pairs)
    features = [a["features"] for a in accidents]
    model = PreferenceModel(len(features[0]), seed=0)
    fit = model.fit(features, train_pairs, epochs=300)
    heldout = model.pair_accuracy(features, test_pairs)
    assert fit["pair_accuracy"] > 0.85 and 0.8 < heldout <= 1.0, (fit, heldout)
    # pairs with the same verdict are ordered by the graded evidence alone: the model learns more than the verdict
    same = [(i, j) for i, j in test_pairs if (scores[i] >= 0.5) == (scores[j] >= 0.5)]
    assert len(same) > 50 and model.pair_accuracy(features, same) > 0.6
    labels = label_accidents(accidents)
    assert model.calibrate([features[i] for i in train_idx], [labels[i] for i in train_idx]) > 0.85
    agree = sum(model.is_effective(accidents[i]) == labels[i] for i in held_out) / len(held_out)
    assert agree >= 0.85, agree
    restored = PreferenceModel.from_dict(model.to_dict())
    assert all(restored.is_effective(a) == model.is_effective(a) for a in accidents[:20])
    assert math.isfinite(fit["bt_loss"])


def _record(accident: dict) -> CollisionRecord:
    return CollisionRecord(**{k: v for k, v in accident.items() if k in CollisionRecord.__dataclass_fields__})


def test_graded_score_orders_by_the_evidence():
    judge = RuleJudge()
    base = random_accidents(1, 3)[0]
    settled = _record({**base, "long": 5.0, "lat": 0.0, "b_in_a_lane_s": 4.0, "b_min_accel": -1.0, "a_headway_s": 0.5})
    just = _record({**base, "long": 5.0, "lat": 0.0, "b_in_a_lane_s": 1.2, "b_min_accel": -1.0, "a_headway_s": 2.5})
    rammed = _record({**base, "long": -5.0, "lat": 0.0, "striker": "adv0", "a_in_b_lane_s": 4.0})
    # closed form: (settled + tight + gentle) / 3 -> 0.5 + 0.5 * evidence
    assert judge.score(settled) == pytest.approx(0.5 + 0.5 * (1.0 + (1 - 0.5 / 3) + 0.9) / 3)
    assert judge.score(just) == pytest.approx(0.5 + 0.5 * (0.3 + (1 - 2.5 / 3) + 0.9) / 3)
    assert judge.score(settled) > judge.score(just) >= 0.5 > judge.score(rammed) == 0.0


def test_llm_judge_compares_pairs_and_falls_back():
    from palaestra.aed.judge import LLMJudge
    from palaestra.shared.llm.base import Completion, LLMClient

    class Says(LLMClient):
        def __init__(self, texts):
            self.texts = texts

        def chat(self, conversations, params=None, tools=None):
            return [Completion(t, [], None, [], "stop") for t, _ in zip(self.texts, conversations)]

    accidents = random_accidents(3, 4)
    judge = LLMJudge(Says(["... <answer>B</answer>", "... <answer>A</answer>", "no idea"]))
    pairs = compare_pairs(accidents, judge, max_pairs=3, seed=0)
    chosen = random.Random(0).sample([(0, 1), (0, 2), (1, 2)], 3)
    scores = [RuleJudge().score(_record(a)) for a in accidents]
    i, j = chosen[2]
    expected_last = (i, j) if scores[i] >= scores[j] else (j, i)  # the unparseable answer: the graded rule score
    assert pairs == [chosen[0][::-1], chosen[1], expected_last]
    assert judge.fallbacks == 1 and judge.calls == 3


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
