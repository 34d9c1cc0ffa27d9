"""RAE (`palaestra.mars.rae`) against a re-implementation written here from SPIRAL's description.

SPIRAL (arXiv 2506.24119, section "Role-conditioned advantage estimation"): each role keeps a moving average
b of its returns, b <- α b + (1 - α) R, starting at 0; the advantage is R - b with b read before the update;
α 0.95. Here the roles are (game, seat).
"""

from __future__ import annotations

import numpy as np
import pytest

from palaestra.mars import plugins  # noqa: F401  (registers `rae`)
from palaestra.mars.rae import BASELINES, RoleBaselines
from palaestra.shared.jobs import load_config
from palaestra.shared.rl.advantages import AdvantageInput, AdvantageStep, check_pipeline, compute_advantages


def _spiral(steps: list[list[tuple[str, str, float]]], decay: float) -> list[list[float]]:
    """Per step, per trajectory (game, seat, return): R - b, from the paper's text."""
    b: dict[tuple[str, str], float] = {}
    out = []
    for step in steps:
        row = []
        for game, seat, ret in step:
            before = b.get((game, seat), 0.0)
            row.append(ret - before)
            b[(game, seat)] = decay * before + (1 - decay) * ret
        out.append(row)
    return out


def _batch(step: list[tuple[str, str, float]], rng: np.random.Generator) -> AdvantageInput:
    rewards = []
    for _, _, ret in step:  # the return split over 1-3 turns: RAE reads only the sum
        parts = rng.dirichlet(np.ones(rng.integers(1, 4)))
        rewards.append(parts * ret)
    return AdvantageInput(
        turn_rewards=rewards,
        group_ids=[str(i) for i in range(len(step))],
        agents=[seat for _, seat, _ in step],
        env_types=[game for game, _, _ in step],
        turn_tokens=[np.ones(len(r)) for r in rewards],
    )


def _steps(seed: int, n: int = 4) -> list[list[tuple[str, str, float]]]:
    rng = np.random.default_rng(seed)
    games, seats = ["kuhn_poker", "tic_tac_toe"], ["player_0", "player_1"]
    return [
        [(str(rng.choice(games)), str(rng.choice(seats)), float(rng.normal(0.3, 1.0))) for _ in range(12)]
        for _ in range(n)
    ]


def _run(steps, decay, rng) -> list[list[float]]:
    pipeline = [AdvantageStep("rae", {"decay": decay})]
    out = []
    for step in steps:
        values = compute_advantages(pipeline, _batch(step, rng))
        for v in values:  # one value per trajectory, on all of its turns
            assert np.all(v == v[0])
        out.append([float(v[0]) for v in values])
    return out


@pytest.mark.parametrize("decay", [0.95, 0.5])
def test_rae_equals_spirals_moving_average_across_steps(decay):
    BASELINES.reset()
    steps = _steps(0)
    got = _run(steps, decay, np.random.default_rng(1))
    np.testing.assert_allclose(got, _spiral(steps, decay), rtol=0, atol=1e-12)
    # negative control: one baseline shared by all roles gives other values
    shared = _spiral([[("g", "s", r) for _, _, r in step] for step in steps], decay)
    assert not np.allclose(got, shared)


def test_rae_state_resumes_where_it_stopped():
    steps, decay = _steps(3, n=6), 0.9
    BASELINES.reset()
    straight = _run(steps, decay, np.random.default_rng(2))
    BASELINES.reset()
    first = _run(steps[:3], decay, np.random.default_rng(2))
    saved = BASELINES.state_dict()
    BASELINES.reset()  # a new process
    fresh = _run(steps[3:], decay, np.random.default_rng(2))
    BASELINES.load_state_dict(saved)
    resumed = _run(steps[3:], decay, np.random.default_rng(2))
    np.testing.assert_allclose(first + resumed, straight, atol=1e-12)
    assert not np.allclose(fresh, straight[3:])  # without the state the baselines restart at 0


def test_rae_refuses_bad_decay_and_a_place_after_another_step():
    batch = _batch([("kuhn_poker", "player_0", 1.0)], np.random.default_rng(0))
    with pytest.raises(ValueError, match="decay must lie in"):
        compute_advantages([AdvantageStep("rae", {"decay": 1.0})], batch)
    with pytest.raises(ValueError, match="starts a pipeline"):
        compute_advantages([AdvantageStep("turn_level"), AdvantageStep("rae")], batch)
    with pytest.raises(ValueError, match="unknown option 'gamma'"):
        check_pipeline([AdvantageStep("rae", {"gamma": 0.9})])


def test_rae_is_a_mars_train_estimator():
    cfg = load_config({"job": "mars.train", "advantages": [{"name": "rae", "options": {"decay": 0.95}}]})
    assert [a.name for a in cfg.advantages] == ["rae"]
    keys = RoleBaselines()
    assert keys.advantage("g/p", 2.0, 0.95) == 2.0 and keys.advantage("g/p", 2.0, 0.95) == pytest.approx(1.9)
