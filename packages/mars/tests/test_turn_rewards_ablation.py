"""The estimator ablation where turns carry their own rewards: its two estimators against formulas written here,
and its configs (committed before any run) differing in the advantage pipeline only."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from palaestra.mars import plugins  # noqa: F401  (registers episode_return, batch_norm, rae)
from palaestra.shared.matrix import file_combinations
from palaestra.shared.rl.advantages import AdvantageInput, AdvantageStep, compute_advantages

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments" / "mars"
FILES = ("turn_rewards_ablation.yaml", "turn_rewards_ablation_hanabi.yaml")


def _batch(rewards: list[list[float]], agents: list[str]) -> AdvantageInput:
    r = [np.array(x, dtype=np.float64) for x in rewards]
    return AdvantageInput(r, [str(i) for i in range(len(r))], agents, ["g"] * len(r), [np.ones(len(x)) for x in r])


def test_episode_return_and_batch_norm_follow_their_formulas():
    rewards = [[1.0, 0.0, 2.0], [0.5], [0.0, -1.0]]
    batch = _batch(rewards, ["player_0", "player_1", "player_0"])
    episode = compute_advantages([AdvantageStep("episode_return")], batch)
    assert [list(v) for v in episode] == [[3.0] * 3, [0.5], [-1.0] * 2]
    turns = [3.0, 3.0, 3.0, 0.5, -1.0, -1.0]  # every turn once, all seats pooled
    mean, sd = sum(turns) / 6, float(np.std(turns, ddof=1))
    normed = compute_advantages([AdvantageStep("episode_return"), AdvantageStep("batch_norm")], batch)
    assert np.concatenate(normed) == pytest.approx([(t - mean) / (sd + 1e-6) for t in turns])
    # turn-level returns to go differ from the episode return where later turns score
    to_go = compute_advantages([AdvantageStep("turn_level"), AdvantageStep("batch_norm")], batch)
    assert not np.allclose(np.concatenate(to_go), np.concatenate(normed))
    flat = compute_advantages([AdvantageStep("episode_return"), AdvantageStep("batch_norm")], _batch([[1.0]], ["p"]))
    assert list(flat[0]) == [0.0]  # one turn: nothing to normalize against
    with pytest.raises(ValueError, match="put episode_return or turn_level first"):
        compute_advantages([AdvantageStep("batch_norm")], batch)


@pytest.mark.parametrize("name", FILES)
def test_ablation_arms_differ_in_the_estimator_only(name):
    text = (EXPERIMENTS / name).read_text()
    assert text.startswith("# NOT RUN YET")
    combos = {(c.values["seed"], c.values["arm"]): c.cfg for c in file_combinations(EXPERIMENTS / name)}
    arms = {
        "episode_batch": ["episode_return", "batch_norm"],
        "episode_agent": ["episode_return", "agent_norm"],
        "turn_batch": ["turn_level", "batch_norm"],
        "turn_agent": ["turn_level", "agent_norm"],
        "rae": ["rae"],
    }
    assert set(combos) == {(s, a) for s in range(5) for a in arms}
    skip = ("advantages", "output_dir", "envs")
    for s in range(5):
        first = {k: v for k, v in asdict(combos[s, "rae"]).items() if k not in skip}
        for arm, names in arms.items():
            cfg = combos[s, arm]
            assert [a.name for a in cfg.advantages] == names and cfg.rollout.group_size == 1
            assert {k: v for k, v in asdict(cfg).items() if k not in skip} == first
    game = combos[0, "rae"].games[0].game
    assert game == ("mini_hanabi" if "hanabi" in name else "kuhn_poker")
    if game == "kuhn_poker":
        assert combos[0, "rae"].shaping.valid_turn_bonus == 0.05  # MARS's shaping: each turn its own reward


def test_leduc_two_policies_arms_differ_where_they_say():
    path = EXPERIMENTS / "leduc_two_policies.yaml"
    assert path.read_text().startswith("# NOT RUN YET")
    combos = {(c.values["seed"], c.values["arm"]): c.cfg for c in file_combinations(path)}
    assert len(combos) == 15
    skip = ("advantages", "output_dir", "envs", "policies", "steps", "sft_warmup")
    base = {k: v for k, v in asdict(combos[0, "shared_norm"]).items() if k not in skip}
    for (seed, arm), cfg in combos.items():
        assert cfg.games[0].game == "leduc_poker" and cfg.eval.exploitability == ["leduc_poker"]
        assert [a.name for a in cfg.advantages] == (["rae"] if arm.endswith("rae") else ["turn_level", "agent_norm"])
        assert bool(cfg.policies) == arm.startswith("two")
        if seed == 0:
            assert {k: v for k, v in asdict(cfg).items() if k not in skip} == base
    assert combos[0, "control"].steps == 0 and combos[0, "control"].sft_warmup.steps == 360
