"""A recorded accident replays from its record: the same collision at the same frame, on video."""

from __future__ import annotations

import json

import pytest

from palaestra.aed.adversary import AdversarySpec
from palaestra.aed.evaluation import evaluate
from palaestra.aed.replay import main, replay

SPEC = AdversarySpec("highway", "rear_end", overrides={"vehicles_count": 12}, max_steps=20)


class Rammer:
    """Scripted adversary: steer into the victim's lane, then close in (observation: victim long/50, lat/10)."""

    def predict(self, obs, deterministic=True):
        long, lat = obs[6] * 50, obs[7] * 10
        if abs(lat) > 2.0:
            return (2 if lat > 0 else 0), None  # LANE_RIGHT / LANE_LEFT
        return (3 if long > 0 else 4), None  # FASTER toward a victim ahead, SLOWER in front of it


@pytest.fixture(scope="module")
def recorded():
    ev = evaluate(Rammer(), SPEC, episodes=3, seed=7)
    assert ev["accidents"], "no accident in 3 episodes"
    return ev["accidents"][0]


def test_replay_reproduces_the_collision_at_the_same_frame(recorded, tmp_path):
    import imageio.v2 as imageio

    out = replay(recorded, SPEC, video=tmp_path / "replay.gif")
    contact = out["contact"]
    assert out["same"] and contact is not None
    assert (contact["step"], contact["t"], contact["b_role"]) == (recorded["step"], recorded["t"], recorded["b_role"])
    assert contact["long"] == pytest.approx(recorded["long"]) and contact["lat"] == pytest.approx(recorded["lat"])
    frames = imageio.mimread(tmp_path / "replay.gif")
    # highway-fast: the reset frame, then 5 simulation frames per policy step up to the collision's step (GIF
    # writers merge the identical frames that hold the collision on screen)
    assert out["frames"] == 1 + 5 * (recorded["step"] + 1) and len(frames) >= out["frames"]


def test_another_action_trace_is_another_episode(recorded):
    # the check above could fail: the same seed with other actions does not give this collision
    other = {**recorded, "actions": [(a + 2) % 5 for a in recorded["actions"]]}
    out = replay(other, SPEC)
    assert not out["same"]


def test_replay_command_line(recorded, tmp_path, capsys):
    path = tmp_path / "accidents.json"
    from dataclasses import asdict

    path.write_text(json.dumps({"spec": asdict(SPEC), "accidents": [recorded]}))
    assert main([str(path), "--out", str(tmp_path / "a.gif")]) == 0
    assert "same as recorded" in capsys.readouterr().out and (tmp_path / "a.gif").exists()
    with pytest.raises(SystemExit, match="out of range"):
        main([str(path), "--index", "3"])
