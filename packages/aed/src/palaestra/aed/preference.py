"""Preference learning over accidents: a Bradley-Terry reward model of AV responsibility.

Pairs of accident trajectories (``accident_features``: the contact geometry
and the adversary's last steps) are compared by a judge: which of the two is
the AV more responsible for (`compare_pairs`: the graded rule score
`RuleJudge.score`, or an `LLMJudge` reading both records). A small MLP
``r(x)`` is fitted with the Bradley-Terry likelihood
``P(a > b) = sigmoid(r(a) - r(b))`` on the pairs among training accidents,
and its accuracy is reported on pairs among held-out accidents
(`split_pairs`). BT scores are shift-invariant, so the effectiveness
threshold is the score that best separates the judge's per-accident verdicts
on the training accidents (`PreferenceModel.calibrate`).

Fine-tuning uses the model in two ways (`AdversaryEnv`):

- `PreferenceModel.is_effective(accident)` filters accidents: an effective one
  earns ``effective_bonus``; an ineffective one earns nothing, minus
  ``ineffective_penalty``.
- `PreferenceModel.margin(features)` is a dense reward: at every step near the
  victim, the adversary-victim pair is recorded as if it touched now and the
  model scores that would-be accident, so the adversary is paid for setting up
  contacts the judge would blame on the victim (settled ahead in its lane, no
  brake check) long before one happens. Responsible accidents are rare (about
  one in ten with the IDM victim), too rare for the sparse filter alone.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np


def accident_features(rec, recent_states: list[dict]) -> list[float]:
    """Fixed-length features of an accident trajectory (the contact geometry and the last steps before it)."""
    geo = [
        rec.long / 10,
        rec.lat / 5,
        math.sin(rec.heading_diff),
        math.cos(rec.heading_diff),
        rec.a_speed / 30,
        rec.b_speed / 30,
        float(rec.a_lane_changing),
        float(rec.b_lane_changing),
        min(rec.b_in_a_lane_s, 4.0) / 4,
        min(rec.a_in_b_lane_s, 4.0) / 4,
        max(rec.b_min_accel, -20.0) / 10,
        max(rec.a_min_accel, -20.0) / 10,
        float(rec.striker == "victim"),
    ]
    rel = [s["rel"] for s in recent_states] or [{"long": 0.0, "lat": 0.0, "closing_speed": 0.0}]
    traj = [
        float(np.mean([r["long"] for r in rel])) / 20,
        float(np.mean([r["lat"] for r in rel])) / 5,
        float(np.mean([r["closing_speed"] for r in rel])) / 10,
    ]
    return geo + traj


class PreferenceModel:
    def __init__(self, n_features: int, hidden: int = 32, seed: int = 0):
        import torch

        torch.manual_seed(seed)
        self.n_features, self.hidden = n_features, hidden
        self.net = torch.nn.Sequential(torch.nn.Linear(n_features, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
        self.threshold = 0.0

    def scores(self, features) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.net(torch.as_tensor(np.asarray(features, np.float32))).squeeze(-1).numpy()

    def margin(self, features) -> float:
        """Score of one accident's features minus the effectiveness threshold (> 0: effective)."""
        return float(self.scores([features])[0] - self.threshold)

    def is_effective(self, accident: dict) -> bool:
        return self.margin(accident["features"]) >= 0.0

    def fit(
        self,
        features: list[list[float]],
        pairs: list[tuple[int, int]],
        epochs: int = 200,
        lr: float = 1e-2,
    ) -> dict[str, float]:
        """Fit on judged pairs ``(preferred, other)`` (indices into `features`); return loss and pair accuracy."""
        import torch

        if not pairs:
            raise ValueError("preference learning needs at least one judged pair of accidents")
        x = torch.as_tensor(np.asarray(features, np.float32))
        win = torch.as_tensor([p[0] for p in pairs])
        lose = torch.as_tensor([p[1] for p in pairs])
        opt = torch.optim.Adam(self.net.parameters(), lr=lr, weight_decay=1e-4)
        for _ in range(epochs):
            r = self.net(x).squeeze(-1)
            loss = -torch.nn.functional.logsigmoid(r[win] - r[lose]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return {
            "pairs": len(pairs),
            "bt_loss": float(loss.detach()),
            "pair_accuracy": self.pair_accuracy(features, pairs),
        }

    def pair_accuracy(self, features: list[list[float]], pairs: list[tuple[int, int]]) -> float:
        """Share of pairs whose preferred accident scores higher."""
        if not pairs:
            return float("nan")
        s = self.scores(features)
        return float(np.mean([s[i] > s[j] for i, j in pairs]))

    def calibrate(self, features: list[list[float]], labels: list[bool]) -> float:
        """Set the threshold that best separates the per-accident verdicts; return that accuracy."""
        s = self.scores(features)
        y = np.asarray(labels, bool)
        candidates = np.unique(s)
        accuracy = [((s >= t) == y).mean() for t in candidates]
        self.threshold = float(candidates[int(np.argmax(accuracy))])
        return float(max(accuracy))

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_features": self.n_features,
            "hidden": self.hidden,
            "threshold": self.threshold,
            "state_dict": {k: v.tolist() for k, v in self.net.state_dict().items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreferenceModel:
        import torch

        model = cls(data["n_features"], data["hidden"])
        model.net.load_state_dict({k: torch.as_tensor(v) for k, v in data["state_dict"].items()})
        model.threshold = data["threshold"]
        return model


def split_pairs(
    n: int, pairs: list[tuple[int, int]], holdout: float = 0.25, seed: int = 0
) -> tuple[list[int], list[tuple[int, int]], list[tuple[int, int]]]:
    """Hold out a share of the accidents: (training accidents, pairs among them, pairs among the held-out ones).
    Pairs across the two sets are dropped, so held-out accuracy is on accidents the model never saw."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    test = set(order[: int(round(holdout * n))])
    train_pairs = [p for p in pairs if p[0] not in test and p[1] not in test]
    test_pairs = [p for p in pairs if p[0] in test and p[1] in test]
    return sorted(set(range(n)) - test), train_pairs, test_pairs


def compare_pairs(
    accidents: list[dict], judge=None, max_pairs: int = 2000, seed: int = 0, tie: float = 0.02
) -> list[tuple[int, int]]:
    """Random pairs of accidents, each ordered ``(more responsible, less)`` by `judge`: None for the graded rule
    score (pairs within `tie` of each other are dropped), or an object with ``compare_many`` (an `LLMJudge`)."""
    from palaestra.aed.judge import RuleJudge

    records = _records(accidents)
    n = len(records)
    every = [(i, j) for i in range(n) for j in range(i + 1, n)]
    rng = random.Random(seed)
    chosen = rng.sample(every, min(max_pairs, len(every)))
    if judge is not None and hasattr(judge, "compare_many"):
        picks = judge.compare_many([(records[i], records[j]) for i, j in chosen])
        return [(i, j) if pick == 0 else (j, i) for (i, j), pick in zip(chosen, picks)]
    score = [RuleJudge().score(r) for r in records]
    return [(i, j) if score[i] > score[j] else (j, i) for i, j in chosen if abs(score[i] - score[j]) > tie]


def _records(accidents: list[dict]):
    from palaestra.aed.attribution import CollisionRecord

    fields = CollisionRecord.__dataclass_fields__
    return [CollisionRecord(**{k: v for k, v in a.items() if k in fields}) for a in accidents]


def label_accidents(accidents: list[dict], judge=None) -> list[bool]:
    """Responsibility labels for accidents: from `judge` (e.g. an `LLMJudge`) or the rule verdict recorded in them."""
    if judge is None:
        return [bool(a["victim_responsible"]) for a in accidents]
    records = _records(accidents)
    if hasattr(judge, "judge_many"):
        return judge.judge_many(records)
    return [bool(judge(r)) for r in records]


def relabel_replay(model, accidents: list[dict], slots: list, is_effective, bonus: float, penalty: float) -> dict:
    """Rewrite the reward of past accident transitions in a DQN replay buffer under the preference filter.

    Fine-tuning otherwise keeps replaying the pre-training transitions with their old reward (e.g. +10 for
    ramming the victim), which teaches the old behaviour as fast as the new transitions teach the new one.
    Each accident's reward ``r`` becomes what `AdversaryEnv` pays during fine-tuning: ``r + bonus`` if the model
    scores it effective, else ``min(r, 0) - penalty``. ``slots`` are the (buffer position, env index) recorded
    by `train.train_adversary` (None where the model has no replay buffer); nothing is rewritten once the buffer
    has wrapped around (the slots may hold newer transitions)."""
    buffer = getattr(model, "replay_buffer", None)
    done = {"relabelled": 0, "relabelled_effective": 0}
    if buffer is None or buffer.full:
        return done
    for accident, slot in zip(accidents, slots):
        if slot is None or slot[0] >= buffer.pos:
            continue
        pos, env_idx = slot
        old = float(buffer.rewards[pos, env_idx])
        effective = bool(is_effective(accident))
        buffer.rewards[pos, env_idx] = old + bonus if effective else min(old, 0.0) - penalty
        done["relabelled"] += 1
        done["relabelled_effective"] += effective
    return done
